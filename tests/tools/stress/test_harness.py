"""A small chaos run (4 workers, 8 s) keeps every invariant, and leaves no process or segment.

It is real processes on a loaded 2-core machine, with other tests running, so it asserts what no
load can excuse: counts (events lost, torn snapshots, versions routed unpublished, kills,
publications) and that the stall figures are measured. The stall bound itself (route() stalls
at most 1 ms) is a timing: `gearshift stress` gates on it (its exit status), run as a benchmark
on a machine whose load is known (docs/tools.md, "Stalls").
"""

from __future__ import annotations

import random

from isolated import needs_pidns

from gearshift.tools.stress import StressConfig, run
from gearshift.tools.stress.harness import chaos_plan

from .procs import processes_naming, shm_entries


def test_a_chaos_run_keeps_every_invariant(namespace: str) -> None:
    report = run(StressConfig(workers=4, seconds=8, chaos=True, namespace=namespace))
    details = report.details
    assert report.worker_kills >= 2 and report.controller_kills >= 2
    assert report.events_consumed > 0 and details["controller_dead_seconds"] > 0
    assert report.events_lost == 0
    assert report.events_sent == report.events_consumed + report.events_dropped
    assert details["counter_mismatches"] == []
    assert report.snapshots_published >= 10 and details["versions_verified"] >= 10
    assert report.torn_snapshots_accepted == 0 and details["versions_routed_unpublished"] == 0
    assert report.propagation_ms_p99 is not None
    # every route() call finished records one event; a killed worker leaves one in flight
    calls, incarnations = details["route_calls"], details["worker_incarnations"]
    assert report.events_sent - incarnations <= calls <= report.events_sent
    assert 0 <= details["route_stall_ms_p999"] <= report.route_stall_ms_max, details
    assert report.leaked_segments == 0 and not shm_entries(namespace)
    assert not processes_naming(namespace)


def test_the_chaos_plan_kills_each_kind_at_least_twice_within_the_run() -> None:
    for seconds in (1.0, 15.0, 30.0):
        plan = chaos_plan(seconds, random.Random(0))
        assert plan == sorted(plan) and all(0 < t < seconds for t, _ in plan)
        kinds = [kind for _, kind in plan]
        assert kinds.count("controller") >= max(2, seconds // 5)
        assert kinds.count("worker") >= max(2, int(seconds))


@needs_pidns
def test_a_pod_shaped_chaos_run_keeps_every_invariant(namespace: str) -> None:
    """The controller and each worker in a pid namespace of its own, sharing /dev/shm, killed
    and restarted at random: nothing lost, no namespace replaced, never two controllers."""
    report = run(StressConfig(workers=2, seconds=5, chaos=True, namespace=namespace, pod=True))
    details = report.details
    assert report.worker_kills >= 2 and report.controller_kills >= 1
    assert report.events_consumed > 0 and report.events_lost == 0
    assert details["namespace_replaced"] == 0 and details["controllers_at_once"] == 0
    assert report.torn_snapshots_accepted == 0 and details["versions_routed_unpublished"] == 0
    assert details["counter_mismatches"] == []
    assert report.leaked_segments == 0 and not shm_entries(namespace)
    assert not processes_naming(namespace)
