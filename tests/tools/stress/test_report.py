"""The accounting of a stress run's figures, and its invariants."""

from __future__ import annotations

import dataclasses

from gearshift.tools.stress import KEYS, StressReport
from gearshift.tools.stress.report import sent, tail_percentile

CLEAN = StressReport(
    workers=4,
    seconds=30.0,
    events_sent=10,
    events_consumed=8,
    events_dropped=2,
    events_lost=0,
    snapshots_published=3,
    torn_snapshots_accepted=0,
    worker_kills=2,
    controller_kills=2,
    route_stall_ms_max=0.4,
    propagation_ms_p99=12.0,
    leaked_segments=0,
    details={"versions_routed_unpublished": 0},
)


def test_sent_counts_the_call_in_flight_at_a_kill_only_if_its_event_reached_the_ring() -> None:
    assert sent(started=9, finished=9, recorded=9) == 9  # no call in flight
    assert sent(started=10, finished=9, recorded=10) == 10  # killed after its put
    assert sent(started=10, finished=9, recorded=9) == 9  # killed before its put
    # a route() recording no event, or two, leaves the calls: lost = sent - recorded != 0
    assert sent(started=9, finished=9, recorded=8) - 8 == 1
    assert sent(started=9, finished=9, recorded=10) - 10 == -1


def test_tail_percentile_from_the_slow_calls_only() -> None:
    slow = [900, 100, 500, 300]  # the calls over the floor 50
    assert tail_percentile(slow, 2000, 0.999, 50) == 300  # rank 1998 of 2000: 3rd largest
    assert tail_percentile(slow, 1000, 0.999, 50) == 500
    assert tail_percentile(slow, 500, 0.999, 50) == 900
    assert tail_percentile(slow, 100_000, 0.999, 50) == 50  # somewhere under the floor
    assert tail_percentile([], 0, 0.999, 50) == 50


def test_summary_holds_exactly_the_keys_and_violations_name_what_broke() -> None:
    assert list(CLEAN.summary()) == list(KEYS) and CLEAN.violations() == []
    broken = dataclasses.replace(
        CLEAN,
        events_lost=1,
        torn_snapshots_accepted=2,
        leaked_segments=3,
        route_stall_ms_max=1.5,
        details={"versions_routed_unpublished": 4},
    )
    assert broken.violations() == [
        "torn_snapshots_accepted = 2",
        "events_lost = 1",
        "leaked_segments = 3",
        "route_stall_ms_max = 1.5",
        "versions_routed_unpublished = 4",
    ]


def test_the_verdict_passes_or_names_what_broke_and_states_what_it_checked() -> None:
    assert CLEAN.verdict().startswith("PASS (checked: ")
    assert "events_lost = 0" in CLEAN.verdict() and "route_stall_ms_max <= 1.0" in CLEAN.verdict()
    broken = dataclasses.replace(CLEAN, events_lost=3)
    assert broken.verdict().startswith("FAIL: events_lost = 3 (checked: ")
