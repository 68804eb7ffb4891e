"""Copy plans (`graphs.plans`): a one-chunk call on a ready variant copies through views made
once per (variant, sizes), exact on every call, never those of an older capture."""

from __future__ import annotations

import pytest
import torch

import gearshift as gs
from gearshift.graphs import AdaptiveRunner, Transform, plans
from gearshift.graphs.backends import CpuBackend
from gearshift.graphs.pool import GraphResourcePool

H = 3


def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0


def runner(gears: list[int], pad: float = 0.0) -> AdaptiveRunner:
    dims = {"BATCHSIZE": gs.Dim(gears=gears, max=16, pad_value=pad)}
    r = AdaptiveRunner(Transform(twice, dims, inputs={"x": ("B", None)}),
                          {"x": torch.zeros(1, H)}, pool=GraphResourcePool(CpuBackend()))
    r.capture([{"BATCHSIZE": g} for g in gears])
    return r


def test_every_call_fills_its_padding_rows_and_copies_its_own_rows() -> None:
    """A plan's pads are filled on each call, not once: rows 3..4 of the 3-row call after a
    5-row one hold the pad value, not the 5-row call's rows."""
    r = runner([8], pad=-1.0)
    buffer = r._variants[(8,)].inputs["x"]
    for n in (5, 3, 3):
        x = torch.randn(n, H)
        torch.testing.assert_close(r.run({"x": x}), twice(x))
        assert torch.equal(buffer[:n], x) and bool((buffer[n:] == -1.0).all())
    assert r.stats["replays"] == 3 and r.stats["eager"] == 0
    assert len(r._plans) == 2  # one per (variant, sizes): 5 rows and 3 rows


def test_a_result_is_a_copy_the_next_replay_leaves_alone() -> None:
    r = runner([4])
    x = torch.randn(3, H)
    first = r.run({"x": x})
    r.run({"x": torch.randn(3, H)})
    torch.testing.assert_close(first, twice(x))


def test_a_recaptured_variant_never_runs_a_plan_of_the_graph_it_replaced() -> None:
    """A release that leaves smaller gears re-stages the survivors on new buffers, each
    recaptured (a new graph, new outputs). A plan of the old capture would copy into the old
    buffers and out of the old graph's outputs: the last call's result, not this one's."""
    r = runner([4, 8])
    x = torch.randn(3, H)
    torch.testing.assert_close(r.run({"x": x}), twice(x))  # plan of (4,) on the old buffers
    old = r._variants[(4,)]
    r.gears = {"BATCHSIZE": (4,)}
    assert r.release("BATCHSIZE", 8) == 1 and r._restage
    r.capture([{"BATCHSIZE": 4}])  # re-stages: (4,) recaptured on buffers of 4 rows
    assert r._variants[(4,)] is not old and r._staged.caps == (4,)
    assert not r._plans  # cleared: none keeps the old buffers alive
    for n in (3, 2, 3):
        y = torch.randn(n, H)
        torch.testing.assert_close(r.run({"x": y}), twice(y))
    assert all(p.captured is r._variants[(4,)] for p in r._plans.values())


def test_plans_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plans, "MAX_PLANS", 2)
    r = runner([8])
    for n in (1, 2, 3, 4, 5, 1):
        x = torch.randn(n, H)
        torch.testing.assert_close(r.run({"x": x}), twice(x))
        assert len(r._plans) <= 2


def pair(x: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"y": x * 2.0 + mask.unsqueeze(-1), "m": mask + 1.0}


def test_two_dims_and_a_structure_of_outputs_replay_as_eager() -> None:
    """Pads on two axes (the corner takes the last axis' pad value), outputs cut on both."""
    dims = {"BATCHSIZE": gs.Dim(gears=[2, 4], max=8, pad_value=5.0),
            "SEQLEN": gs.Dim(gears=[8], max=8, pad_value=-3.0)}
    r = AdaptiveRunner(
        Transform(pair, dims, inputs={"x": ("B", "S", None), "mask": ("B", "S")}),
        {"x": torch.zeros(1, 1, H), "mask": torch.zeros(1, 1)},
        pool=GraphResourcePool(CpuBackend()))
    r.capture([{"BATCHSIZE": 4, "SEQLEN": 8}, {"BATCHSIZE": 2, "SEQLEN": 8}])
    for b, s in ((3, 5), (2, 8), (3, 5), (1, 1)):
        tensors = {"x": torch.randn(b, s, H), "mask": torch.rand(b, s)}
        got, want = r.run(tensors), pair(**tensors)
        assert got.keys() == want.keys()
        for k in want:
            torch.testing.assert_close(got[k], want[k])
    mask = r._variants[(4, 8)].inputs["mask"]  # after the (3, 5) call
    assert bool((mask[3, :5] == 5.0).all()) and bool((mask[:, 5:] == -3.0).all())
    assert r.stats["replays"] == 4 and r.stats["eager"] == 0


def test_a_caller_in_another_inference_mode_is_replayed_under_the_transform_s() -> None:
    """Only a caller in the transform's inference mode replays in its own grad mode: a runner
    built outside inference_mode, called inside it, still returns a normal tensor (as its
    eager runs do), replayed."""
    r = runner([4])
    x = torch.randn(3, H)
    with torch.inference_mode():
        out = r.run({"x": x})
    assert not out.is_inference() and r.stats["replays"] == 1
    torch.testing.assert_close(out, twice(x))
    with torch.enable_grad():  # recording: the replay in the caller's mode gives no grad_fn
        out = r.run({"x": x})
    assert out.grad_fn is None and not out.requires_grad and r.stats["replays"] == 2
