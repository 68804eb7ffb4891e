"""A variant's capture on the cpu runs the function once, on the padding probe's padded input
when a probe is due: the probe compares that run's output and replays nothing."""

from __future__ import annotations

import torch
from fakeclock import FakeClock

import gearshift as gs
from gearshift.graphs import AdaptiveRunner, Transform
from gearshift.graphs.backends import CpuBackend
from gearshift.graphs.pool import GraphResourcePool

H = 8
DIMS = {"BATCHSIZE": gs.Dim(gears=[2, 4], max=64), "SEQLEN": gs.Dim(gears=[16], max=64)}
INPUTS = {"x": ("B", "S", None)}


def test_a_cpu_capture_runs_fn_on_the_probe_and_the_probe_replays_nothing() -> None:
    clock, shapes = FakeClock(), []

    @torch.no_grad()
    def fn(x: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(x.shape))
        return torch.tanh(x)

    transform = Transform(fn, DIMS, INPUTS, outputs=("B", "S", None))
    r = AdaptiveRunner(transform, {"x": torch.zeros(1, 1, H)},
                       pool=GraphResourcePool(CpuBackend()), clock=clock)
    shapes.clear()  # the eager check at construction
    assert r.capture([{"BATCHSIZE": 4, "SEQLEN": 16}]) == 1
    # the capture's run, padded to the gear, then the probe's eager run on its real rows
    assert shapes[0] == (4, 16, H) and len(shapes) == 2 and shapes[1] < (4, 16, H)
    x = torch.randn(3, 9, H)
    torch.testing.assert_close(r.run({"x": x}), torch.tanh(x))  # the graph serves requests
    shapes.clear()
    r.release("BATCHSIZE", 4)
    assert r.capture([{"BATCHSIZE": 4, "SEQLEN": 16}]) == 1 and shapes == [(4, 16, H)]


def test_a_capture_on_the_probe_refuses_a_function_that_padding_changes() -> None:
    @torch.no_grad()
    def mixes(x: torch.Tensor) -> torch.Tensor:  # from 8 rows, every row sees the batch's
        if x.shape[0] < 8:  # mean, which padding rows change (the start-up check's gear: 4)
            return x * 2.0
        return x + x.mean(dim=0, keepdim=True)

    transform = Transform(mixes, {"BATCHSIZE": gs.Dim(gears=[1, 4], max=8)}, {"x": ("B", None)},
                          outputs=("B", None))
    r = AdaptiveRunner(transform, {"x": torch.zeros(1, H)}, pool=GraphResourcePool(CpuBackend()))
    assert r.capture([{"BATCHSIZE": 8}]) == 0 and "padding changes" in (r.refused or "")
    x = torch.randn(5, H)
    torch.testing.assert_close(r.run({"x": x}), mixes(x))  # eager, on the unpadded rows
