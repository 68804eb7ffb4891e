"""`gearshift bench snapshot`: a device's snapshot region against what a user would write.

The payload is a large realistic snapshot (protocol.snapshot_payload: 8 profiles of 2 dims at 64
gears each, one change each). Each figure comes with its stand-in measured in the same run:
- version check ("has it changed?"): `SnapshotRegion.version()` against one read of a shared
  `multiprocessing.Value("Q", lock=False)` holding the version, the obvious stand-in (medians
  of batch means);
- transfer: `publish()` + `read()` against `multiprocessing.Queue.put` of the payload +
  `Queue.get` (pickled through the queue's pipe), in microseconds.
Both stand-ins must deliver what they are given (the version, an equal payload). Every figure
is measured in each of `--runs` runs, the designs one after the other, and reported as median
and range (`spread`), ratios run by run.
"""

from __future__ import annotations

import multiprocessing
import operator
import os
import statistics
import time

import click

from gearshift.clikit import json_option
from gearshift.protocol import snapshot_payload
from gearshift.shm import SnapshotRegion
from gearshift.shm.codec import pack
from gearshift.tools.bench.cli import echo_result
from gearshift.tools.bench.ring import per_call_ns
from gearshift.tools.bench.spread import RUNS, paired, summarise


def _payload() -> dict:
    """8 profiles of 2 dims at max_gears_per_type (64) gears, one change each: ~3.3 KB."""
    dims = {"BATCHSIZE": list(range(4, 260, 4)), "SEQLEN": list(range(128, 8320, 128))}
    change = ["SEQLEN", 700, "add", "pad-driven: avg_pad 0.41 >= 0.35 over 37 samples, median 700"]
    names = [f"profile{i}" for i in range(8)]
    return snapshot_payload(0, dict.fromkeys(names, dims), {name: [change] for name in names})


def _transfer_us(q: multiprocessing.Queue, payload: dict, repeats: int = 200) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter_ns()
        q.put(payload)
        got = q.get()
        times.append(time.perf_counter_ns() - began)
    assert got == payload, "the queue changed the payload"
    return statistics.median(times) / 1e3


def _region_us(writer: SnapshotRegion, reader: SnapshotRegion, payload: dict) -> float:
    publish_us = per_call_ns(writer.publish, payload, calls=100) / 1e3
    read_us = per_call_ns(reader.read, calls=100) / 1e3
    snapshot = reader.read()
    assert snapshot is not None and snapshot.payload == payload, "the region changed it"
    return publish_us, read_us


@click.command()
@click.option("--runs", default=RUNS, show_default=True, type=click.IntRange(1),
              help="Runs of every figure (median and range).")
@json_option()
def command(runs: int, as_json: bool) -> None:
    """Time the snapshot version check against a shared Value's read, and publish + read
    against a multiprocessing.Queue."""
    payload = _payload()
    name = f"bench{os.getpid()}"
    writer = SnapshotRegion.create(name, 0)
    reader = SnapshotRegion.attach(name, 0)
    shared = multiprocessing.Value("Q", 0, lock=False)
    read_value = operator.attrgetter("value")
    q: multiprocessing.Queue = multiprocessing.Queue()
    figures: dict[str, list[float]] = {}
    try:
        for _ in range(runs):
            publish_us, read_us = _region_us(writer, reader, payload)
            shared.value = reader.version()
            assert read_value(shared) == reader.version() > 0
            rows = {
                "version_check_ns_median": per_call_ns(reader.version, calls=10_000),
                "baseline_shared_value_ns_median": per_call_ns(read_value, shared, calls=10_000),
                "publish_us_median": publish_us,
                "read_us_median": read_us,
                "transfer_us_median": publish_us + read_us,
                "baseline_queue_transfer_us_median": _transfer_us(q, payload),
            }
            for key, value in rows.items():
                figures.setdefault(key, []).append(value)
    finally:
        q.close()
        reader.close()
        writer.unlink()
        writer.close()
    result: dict[str, object] = {"payload_bytes": len(pack(payload)), "runs": runs}
    for key, values in figures.items():
        summarise(result, key, values)
    paired(result, "version_check_speedup", figures["baseline_shared_value_ns_median"],
           figures["version_check_ns_median"])
    paired(result, "transfer_speedup", figures["baseline_queue_transfer_us_median"],
           figures["transfer_us_median"])
    echo_result(result, as_json)
