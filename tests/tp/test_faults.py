"""Faults of a grouped run (the gloo ranks of test_grouped, two of them): a rank's process
killed (SIGKILL) and replaced, the communicator re-formed by every rank (the survivors keep
their gears while it is gone and `gearshift status` names the missing rank; the new process
catches up to the group's gears, recaptured by every rank together, before the group routes to
them again); a rank's gearshift side replaced mid-run (its process and communicator kept); a
capture failing on one rank only; and the controller killed and restarted mid-run while the
driver's carried version changes between steps. Each passes when no rank fails or hangs, every
step's gear is the same on every rank, and every output equals the unsharded block on the
unpadded input."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

import pytest

from gearshift.clock import MonotonicClock
from gearshift.controller import status, view
from tp import ranks
from tp.launch import Ranks, controller, free_port, lockstep, run_ranks

DEADLINE = 90.0
TOLERANCE = 1e-10  # float64
STEPS, FAULT = 160, 50
SETTINGS = ("check_interval_seconds=0.5", "update_interval_seconds=0.5",
            "status_interval_seconds=0.1")
GONE_SECONDS = 1.5  # the killed rank stays gone this long: three of the controller's checks
SEEN_SECONDS = 10.0  # what the status document must show within


def _status(namespace: str, shows: Callable[[dict[str, Any]], bool]) -> tuple[dict, str]:
    """The first status document (and `gearshift status`'s text) where `shows` holds."""
    end = time.monotonic() + SEEN_SECONDS
    while time.monotonic() < end:
        doc = status.read(namespace)
        if doc is not None and doc.get("groups") and shows(doc):
            return doc, " ".join(view.render(view.gather(namespace, MonotonicClock())).split())
        time.sleep(0.05)
    raise AssertionError(f"the status never showed it: {status.read(namespace)}")


def _gears(doc: dict[str, Any], device: int) -> list[int]:
    (dev,) = (d for d in doc["devices"] if d["device"] == device)
    (prof,) = (p for p in dev["profiles"] if p["name"] == "tp")
    return prof["dims"][0]["gears"]


def test_a_rank_killed_and_replaced_catches_up_with_the_group_before_it_routes_again(
    mp: BaseContext, namespace: str, tmp_path: Path
) -> None:
    run = ranks.Run(namespace, 100, kill=40, reform=free_port())
    seen: dict[str, Any] = {}

    def react(report: tuple, procs: Ranks) -> None:
        if report[0] != "kill":
            return
        procs.kill(report[1])
        doc, seen["text"] = _status(namespace, lambda d: d["groups"][0]["missing"] == [1])
        time.sleep(GONE_SECONDS)  # the controller decides nothing new for the group meanwhile
        later, _ = _status(namespace, lambda d: True)
        seen["gears"] = (_gears(doc, 0), _gears(later, 0))
        procs.start(report[1], dataclasses.replace(run, replacement=True))

    with controller(namespace, tmp_path, *SETTINGS):
        out = run_ranks(mp, ranks.grouped, 2, (run,), deadline=DEADLINE, react=react)
    assert "group 'tp' (profile tp): 2 ranks, present 0; MISSING rank 1" in seen["text"]
    assert seen["gears"][0] == seen["gears"][1], seen  # no new gears while the rank is gone
    (reforming,) = out.of("reforming") or [out.reports]  # the survivor: its communicator broke
    assert reforming[1] == 0 and reforming[3], reforming  # it kept the graphs it held
    assert "GroupError" not in reforming[4], reforming
    done = sorted(out.of("done"), key=lambda d: d[1])
    assert not out.hung and out.exitcodes == [0, 0] and not out.of("error"), out.reports
    assert not out.of("step") and [d[1] for d in done] == [0, 1], out.reports
    driver, replacement = (d[5] for d in done)
    assert done[0][2] == 100 and 0 < done[1][2] <= 60, done  # the failed step served again
    assert all(d[3] <= TOLERANCE and d[4] == 0 for d in done), done
    assert driver["resets"] == 1, driver  # every rank dropped its graphs and recaptured
    assert replacement["captured"] > 0 and replacement["late"] > 0, replacement  # routed again


@pytest.mark.parametrize("step", [1, FAULT])  # 1: before the group had any usable gear
def test_a_rank_whose_gearshift_side_is_replaced_catches_up_with_the_group(
    step: int, mp: BaseContext, namespace: str, tmp_path: Path
) -> None:
    with controller(namespace, tmp_path, *SETTINGS):
        out = run_ranks(mp, ranks.grouped, 2, (ranks.Run(namespace, STEPS, restart=step),),
                        deadline=DEADLINE)
    driver, restarted = lockstep(out, 2, STEPS, TOLERANCE)
    assert driver["resets"] >= 1, driver  # every rank dropped its graphs and recaptured
    assert restarted["captured"] > 0 and restarted["late"] > 0, restarted  # routed again


def test_a_capture_failing_on_one_rank_is_never_routed_and_status_names_it(
    mp: BaseContext, namespace: str, tmp_path: Path
) -> None:
    seen: dict[str, Any] = {}

    def react(report: tuple, _: Ranks) -> None:
        if report[0] == "failed":
            gear = report[3][0]
            _, seen["text"] = _status(namespace, lambda d: d["groups"][0]["lacking"] == [
                [1, [[gear]]]])
            seen["gear"] = gear

    with controller(namespace, tmp_path, *SETTINGS):
        out = run_ranks(mp, ranks.grouped, 2, (ranks.Run(namespace, 240, fail=120),),
                        deadline=DEADLINE, react=react)
    driver, failing = lockstep(out, 2, 240, TOLERANCE)  # no error: never routed to it
    assert f"rank 1 lacks {seen['gear']}" in seen["text"], seen
    assert failing["capture_failures"] == 1 and driver["capture_failures"] == 0
    assert driver["resets"] == 0 and failing["replays"] > 0, failing


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
