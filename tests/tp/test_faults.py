"""Faults of a grouped run (the gloo ranks of test_grouped, two of them): a rank's gearshift
side replaced mid-run (a restarted rank catches up to the group's gears, recaptured by every
rank together, before the group routes to them again), and the controller killed and
restarted mid-run while the driver's carried version changes between steps. Each passes when
no rank fails or hangs, every step's gear is the same on every rank, and every output equals
the unsharded block on the unpadded input."""

from __future__ import annotations

from multiprocessing.context import BaseContext
from pathlib import Path

from tp import ranks
from tp.launch import controller, lockstep, run_ranks

DEADLINE = 90.0
TOLERANCE = 1e-10  # float64
STEPS, FAULT = 160, 50
SETTINGS = ("check_interval_seconds=0.5", "update_interval_seconds=0.5")


def test_a_restarted_rank_catches_up_with_the_group_before_it_routes_again(
    mp: BaseContext, namespace: str, tmp_path: Path
) -> None:
    with controller(namespace, tmp_path, *SETTINGS):
        out = run_ranks(mp, ranks.grouped, 2, (ranks.Run(namespace, STEPS, restart=FAULT),),
                        deadline=DEADLINE)
    driver, restarted = lockstep(out, 2, STEPS, TOLERANCE)
    assert driver["resets"] >= 1, driver  # every rank dropped its graphs and recaptured
    assert restarted["captured"] > 0 and restarted["late"] > 0, restarted  # routed again


def test_the_group_keeps_in_lockstep_across_a_controller_killed_and_restarted(
    mp: BaseContext, namespace: str, tmp_path: Path
) -> None:
    with controller(namespace, tmp_path, *SETTINGS) as restart:
        out = run_ranks(mp, ranks.grouped, 2, (ranks.Run(namespace, STEPS, crash=FAULT),),
                        deadline=DEADLINE,
                        react=lambda report, _: report[0] == "crash" and restart())
    assert out.of("crash")
    stats = lockstep(out, 2, STEPS, TOLERANCE)
    for one in stats:
        assert one["resets"] == 0 and one["late"] > 0, one  # no recapture; routed again
        assert one["versions"] >= 3, one  # the driver changed version between steps
