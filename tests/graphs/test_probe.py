"""The runner's padding probe (`graphs.probe`), seen through `AdaptiveRunner.capture`: each
new combination of gears is probed, padded from about half its rows, until each has passed."""

from __future__ import annotations

import torch

import gearshift as gs
from gearshift.graphs import AdaptiveRunner, Transform
from gearshift.graphs.backends import CpuBackend
from gearshift.graphs.pool import GraphResourcePool

H = 4
DIMS = {"BATCHSIZE": gs.Dim(gears=[2, 4], max=8), "SEQLEN": gs.Dim(gears=[8, 16], max=16)}


def counted() -> tuple[AdaptiveRunner, list[tuple[int, ...]]]:
    """A runner of a row-wise function that records the shape of every call."""
    calls: list[tuple[int, ...]] = []

    def fn(x: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(x.shape[:2]))
        return torch.tanh(x) * 2

    transform = Transform(fn, DIMS, inputs={"x": ("B", "S", None)})
    r = AdaptiveRunner(transform, {"x": torch.zeros(1, 1, H)},
                          pool=GraphResourcePool(CpuBackend()), replays=0)
    calls.clear()  # the trace and the construction probe
    return r, calls


def test_a_new_combination_is_probed_though_one_of_its_gears_passed_in_another() -> None:
    r, calls = counted()
    r.capture([{"BATCHSIZE": 4, "SEQLEN": 16}])
    assert (2, 8) in calls  # fn on the probe, unpadded: half of each gear
    calls.clear()
    r.capture([{"BATCHSIZE": 4, "SEQLEN": 8}])  # 4 passed, with 16; 8 has not
    assert (2, 4) in calls
    calls.clear()
    r.capture([{"BATCHSIZE": 2, "SEQLEN": 16}])  # 16 passed, with 4; 2 has not
    assert (1, 8) in calls


def test_a_combination_of_gears_that_each_passed_is_not_probed_again() -> None:
    r, calls = counted()
    r.capture([{"BATCHSIZE": 4, "SEQLEN": 16}, {"BATCHSIZE": 2, "SEQLEN": 8}])
    calls.clear()
    r.capture([{"BATCHSIZE": 4, "SEQLEN": 8}])
    assert calls == [(4, 8)]  # the capture alone
