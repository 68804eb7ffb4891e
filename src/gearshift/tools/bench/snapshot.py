"""`gearshift bench snapshot`: a device's snapshot region against a multiprocessing.Queue.

The payload is a large realistic snapshot (protocol.snapshot_payload: 8 profiles of 2 dims at 64
gears each, one change each). Each figure comes with the naive design measured in the same run:
- version check: `SnapshotRegion.version()` ("has it changed?") vs `Queue.empty()`, the naive
  worker's poll for a newer snapshot (medians of batch means).
- transfer: `publish()` + `read()` vs `Queue.put` of the payload + `Queue.get` (pickled through
  the queue's pipe), both in microseconds.
"""

from __future__ import annotations

import multiprocessing
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
        q.get()
        times.append(time.perf_counter_ns() - began)
    return statistics.median(times) / 1e3


@click.command()
@json_option()
def command(as_json: bool) -> None:
    """Time snapshot version check, read and publish against a multiprocessing.Queue."""
    payload = _payload()
    writer = SnapshotRegion.create(f"bench{os.getpid()}", 0)
    reader = SnapshotRegion.attach(f"bench{os.getpid()}", 0)
    try:
        publish_us = per_call_ns(writer.publish, payload, calls=100) / 1e3
        read_us = per_call_ns(reader.read, calls=100) / 1e3
        version_ns = per_call_ns(reader.version, calls=10_000)
    finally:
        reader.close()
        writer.unlink()
        writer.close()
    q: multiprocessing.Queue = multiprocessing.Queue()
    poll_ns = per_call_ns(q.empty, calls=10_000)
    transfer_us = _transfer_us(q, payload)
    q.close()
    result = {
        "payload_bytes": len(pack(payload)),
        "version_check_ns_median": version_ns,
        "baseline_queue_poll_ns_median": poll_ns,
        "version_check_speedup": poll_ns / version_ns,
        "publish_us_median": publish_us,
        "read_us_median": read_us,
        "baseline_queue_transfer_us_median": transfer_us,
        "transfer_speedup": transfer_us / (publish_us + read_us),
    }
    echo_result(result, as_json)
