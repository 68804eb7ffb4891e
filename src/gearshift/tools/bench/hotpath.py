"""`gearshift bench hotpath`: the cost of `Profile.route` on the request path.

One profile (BATCHSIZE gears 1..64 splittable, SEQLEN ladder 1..8192), log-normal request
sizes, routed against a snapshot published by a stand-in controller (the shm primitives only)
in a private namespace. Timed in batches, each batch's ring drained untimed afterwards, so
every event is really written; figures are medians of per-call batch means.

Baseline, measured in the same run, interleaved batch by batch: the single-process design
gearshift replaced (the reference, torch_npu's, as `bench/reference.py` ports its round): a
clone-on-read copy of the gear snapshot per request, the same gear lookup, and, under the
sample lock, one sample object per dim appended to its gear's state.

Where the route's time goes, in the same batches: `Profile.record` (the same checks and one
ring record, no version check, no lookup) and a call of a function that does nothing with the
same keywords (the dict of keywords every design pays); the route less the record is the
version check and the lookup.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import click
import numpy as np

from gearshift import protocol
from gearshift.clikit import json_option
from gearshift.core.dims import Dim, Gears, chunks_for
from gearshift.shm import EventRing, Registry, SnapshotRegion, cleanup
from gearshift.tools.bench.cli import echo_result
from gearshift.worker.session import Client

DIMS = {
    "BATCHSIZE": Dim(gears=[1, 2, 4, 8, 16, 32, 64], max=256, splittable=True),
    "SEQLEN": Dim(min=1, max=8192, align=16),
}
SHAPE = {"BATCHSIZE": (2.5, 1.0), "SEQLEN": (6.0, 1.2)}  # log-normal mean and sigma


@dataclass
class GearSample:
    """The reference's per-event sample of one dim."""

    t: float
    raw: int
    pad: float
    split: float


@dataclass
class GearRuntimeState:
    """The reference's per-gear state, keyed "DIM:gear"."""

    samples: list[GearSample] = field(default_factory=list)
    last_used: float = 0.0


class ReferenceRouter:
    """The reference's in-process request path: clone the snapshot, look gears up, and record one
    sample per dim into its gear's state under the sample lock (`record_event`)."""

    def __init__(self, dims: dict[str, Dim]) -> None:
        self.dims = dims
        self._snapshot = {d: list(s.initial_gears) for d, s in dims.items()}
        self._states: dict[str, GearRuntimeState] = {}
        self._sample_lock = threading.Lock()

    def get_snapshot(self) -> dict[str, list[int]]:
        return {d: list(g) for d, g in self._snapshot.items()}  # clone-on-read, no lock

    def route(self, **sizes: int) -> dict[str, Gears]:
        snapshot = self.get_snapshot()
        plan = {}
        for d, raw in sizes.items():
            self.dims[d].check(d, raw)
            plan[d] = chunks_for(tuple(snapshot[d]), raw, self.dims[d].splittable)
        self.record_event(time.monotonic(), sizes, plan)
        return plan

    def record_event(self, now: float, sizes: dict[str, int], plan: dict[str, Gears]) -> None:
        with self._sample_lock:
            for d, raw in sizes.items():
                gear = plan[d][0] if plan[d] else raw
                pad = (gear - raw) / gear if raw <= gear else 0.0
                split = (raw - gear) / raw if raw > gear else 0.0
                state = self._states.setdefault(f"{d}:{gear}", GearRuntimeState())
                state.samples.append(GearSample(now, raw, pad, split))
                state.last_used = now

    def drain(self) -> None:
        self._states = {}


def _call(**sizes: int) -> None:
    """Nothing: what a call with a request's keywords costs, in every design alike."""


def _requests(n: int) -> list[dict[str, int]]:
    rng = np.random.default_rng(0)
    cols = {
        d: np.clip(rng.lognormal(*SHAPE[d], n), 1, DIMS[d].max).astype(int).tolist() for d in DIMS
    }
    return [dict(zip(cols, values, strict=True)) for values in zip(*cols.values(), strict=True)]


def _batch_ns(call: Callable[..., Any], requests: list[dict[str, int]]) -> float:
    began = time.perf_counter_ns()
    for sizes in requests:
        call(**sizes)
    return (time.perf_counter_ns() - began) / len(requests)


def _version_ns(version: Callable[[], int], calls: int) -> float:
    began = time.perf_counter_ns()
    for _ in range(calls):
        version()
    return (time.perf_counter_ns() - began) / calls


@click.command()
@click.option("--batches", default=400, show_default=True, help="Timed batches per design.")
@click.option("--batch", default=200, show_default=True, help="Requests per batch.")
@json_option()
def command(batches: int, batch: int, as_json: bool) -> None:
    """Median ns per `route` call, per `record` call, per call doing nothing, per snapshot
    version check, and per request of the reference's in-process design, measured in the same
    run."""
    namespace = f"bench-hotpath-{os.getpid()}"
    registry = Registry.create(namespace, slots=1)
    region = SnapshotRegion.create(namespace, 0)
    try:
        registry.claim_controller()
        region.publish(
            protocol.snapshot_payload(0, {"decode": {d: s.initial_gears for d, s in DIMS.items()}})
        )
        client = Client(Registry.attach(namespace), 0, register_timeout=0, background=False)
        ring = EventRing.attach(namespace, client.slot)
        try:
            profile = client.profile("decode", DIMS)
            route, record = profile.route, profile.record
            reference = ReferenceRouter(DIMS)
            requests = _requests(batch)
            for sizes in requests:  # both designs must plan every request alike
                assert route(**sizes).chunks == reference.route(**sizes), sizes
            ring.drain()
            reference.drain()
            mine, recorded, calls, theirs, checks = [], [], [], [], []
            for _ in range(batches):
                mine.append(_batch_ns(route, requests))
                ring.drain()
                recorded.append(_batch_ns(record, requests))
                ring.drain()
                calls.append(_batch_ns(_call, requests))
                theirs.append(_batch_ns(reference.route, requests))
                reference.drain()
                checks.append(_version_ns(client.region.version, batch))
            assert ring.dropped == 0, "the ring overflowed: the timing would flatter route"
        finally:
            ring.close()
            client.close()
            registry.release_controller()
    finally:
        region.close()
        registry.close()
        cleanup(namespace)
    result = {
        "route_ns_median": statistics.median(mine),
        "record_ns_median": statistics.median(recorded),
        "call_ns_median": statistics.median(calls),
        "version_check_ns_median": statistics.median(checks),
        "baseline_inprocess_ns_median": statistics.median(theirs),
    }
    result["ratio"] = result["route_ns_median"] / result["baseline_inprocess_ns_median"]
    echo_result(result, as_json)
