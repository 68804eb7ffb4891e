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
