"""The decision round of a device: one `decide` per profile; a failing profile is isolated only
when the caller asks for it (`on_error`)."""

from __future__ import annotations

import numpy as np
import pytest

from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim
from gearshift.core.round import DeviceLedger, ProfileLedger, decide_round

CONFIG = PolicyConfig()
DIMS = {"B": Dim(gears=(1, 8, 64), max=64)}


class Broken:
    history = None

    def view(self, now: float) -> object:
        raise OverflowError("no view")


def _device() -> DeviceLedger:
    good, bad = ProfileLedger.new(DIMS, 0.0, CONFIG), ProfileLedger.new(DIMS, 0.0, CONFIG)
    good.stats["B"].fold(np.full(50, 1.0), np.full(50, 40))
    bad.stats["B"] = Broken()  # type: ignore[assignment]
    return DeviceLedger(profiles={"good": good, "bad": bad})


def test_a_failing_profile_raises_without_on_error() -> None:
    with pytest.raises(OverflowError):
        decide_round(_device(), 2.0, None, CONFIG)


def test_with_on_error_the_failing_profile_is_reported_and_left_out() -> None:
    failed: list[tuple[str, str]] = []
    round = decide_round(_device(), 2.0, None, CONFIG, lambda n, e: failed.append((n, str(e))))
    assert failed == [("bad", "no view")]
    assert round is not None and set(round.gears) == set(round.changes) == {"good"}


def test_a_round_in_which_every_profile_failed_is_none() -> None:
    device = _device()
    del device.profiles["good"]
    assert decide_round(device, 2.0, None, CONFIG, lambda n, e: None) is None


LADDER = {"S": Dim(max=2048)}  # the start-up ladder 1, 2, 4, ..., 2048


def _first_round(events: int, mode: str, memory: float | None = None):
    """A new profile's first round, 12 ms after it registered, over `events` requests of 300."""
    config = PolicyConfig(policy_mode=mode)
    device = DeviceLedger(profiles={"p": ProfileLedger.new(LADDER, 0.0, config)})
    device.profiles["p"].stats["S"].fold(np.linspace(0.001, 0.011, events), np.full(events, 300))
    return decide_round(device, 0.012, memory, config)


@pytest.mark.parametrize("mode", ["plan", "rules"])
def test_a_round_changes_no_gear_before_the_window_holds_min_window_events(mode: str) -> None:
    few = _first_round(CONFIG.min_window_events - 1, mode)
    assert few is not None and few.changes == {"p": ()}
    assert few.gears["p"]["S"].gears == LADDER["S"].initial_gears


def test_the_round_acts_once_the_window_holds_min_window_events() -> None:
    enough = _first_round(CONFIG.min_window_events, "plan")
    assert enough is not None and enough.changed
    assert 300 in enough.gears["p"]["S"].gears


def test_memory_pressure_still_acts_on_a_handful_of_events() -> None:
    pressed = _first_round(2, "plan", memory=0.95)
    assert pressed is not None and pressed.changed
    assert len(pressed.gears["p"]["S"].gears) < len(LADDER["S"].initial_gears)
