"""The grad mode of a runner's runs (`graphs.grad`): graphs built for what the caller runs
under (a runner built under `torch.inference_mode` captures and replays, on the swap thread
too), the same outputs eager and replayed (no grad_fn), inputs that require grad refused."""

from __future__ import annotations

import threading

import pytest
import torch

import gearshift as gs
from gearshift.graphs import AdaptiveRunner, Transform, grad
from gearshift.graphs.backends import CpuBackend
from gearshift.graphs.pool import GraphResourcePool
from gearshift.graphs.torchcompile import CompiledRunner

H = 4
DIMS = {"SEQLEN": gs.Dim(gears=[4, 8], max=64)}
torch.manual_seed(0)
LAYER = torch.nn.Linear(H, H)  # its parameters require grad, as a model's do


def fn(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(LAYER(x))


def swap_thread(runner: AdaptiveRunner) -> None:
    """Capture every gear on another thread, outside the caller's mode (thread-local)."""
    errors: list[BaseException] = []

    def capture() -> None:
        try:
            runner.capture([{"SEQLEN": 8}, {"SEQLEN": 4}])
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=capture)
    thread.start()
    thread.join(60)
    assert not errors, errors


@pytest.mark.parametrize("compiled", [False, True])
def test_a_runner_built_under_inference_mode_captures_and_replays(compiled: bool) -> None:
    """Serving code runs under inference_mode: its static buffers are inference tensors, which
    the swap thread may only write inside it (before: every capture failed, 0 replays)."""
    pool = GraphResourcePool(CpuBackend())
    with torch.inference_mode():
        transform = Transform(fn, DIMS, inputs={"x": ("S", None)})
        example = {"x": torch.zeros(1, H)}
        runner = (CompiledRunner(transform, example, pool=pool, compile_backend="eager")
                  if compiled else AdaptiveRunner(transform, example, pool=pool))
    swap_thread(runner)
    assert runner.stats["captures"] == 2 and runner.stats["capture_failures"] == 0
    with torch.inference_mode():
        for n in (3, 8, 5, 1):
            x = torch.randn(n, H)
            torch.testing.assert_close(runner.run({"x": x}), fn(x))
    assert runner.stats["replays"] == 4 and runner.stats["eager"] == 0
    x = torch.randn(3, H)  # a later call outside inference_mode is served the same way
    torch.testing.assert_close(runner.run({"x": x}), fn(x).detach())


def test_eager_and_replayed_outputs_alike_carry_no_grad_fn() -> None:
    """Before: the first (eager) output had a grad_fn through the model's parameters, the
    replayed ones none, silently."""
    runner = AdaptiveRunner(Transform(fn, DIMS, inputs={"x": ("S", None)}),
                               {"x": torch.zeros(1, H)}, pool=GraphResourcePool(CpuBackend()))
    x = torch.randn(3, H)
    eager = runner.run({"x": x})
    swap_thread(runner)
    replayed = runner.run({"x": x})
    assert runner.stats["eager"] == 1 and runner.stats["replays"] == 1
    assert eager.grad_fn is None and replayed.grad_fn is None
    torch.testing.assert_close(eager, replayed)
    wanting = torch.randn(3, H, requires_grad=True)
    with pytest.raises(gs.ShapeError, match=r"x require.* grad.*detach"):
        runner.run({"x": wanting})
    with torch.no_grad():  # not recording: nothing is lost
        torch.testing.assert_close(runner.run({"x": wanting}), fn(wanting))


@pytest.mark.parametrize("inference", [False, True])
def test_the_mode_block_sets_the_mode_and_restores_the_caller_s(inference: bool) -> None:
    """`grad.mode`: the transform's mode inside, the caller's after, from every caller's mode
    (a caller in the mode already gets a block that changes nothing)."""
    callers = [torch.enable_grad, torch.no_grad, torch.inference_mode]
    for caller in callers:
        with caller():
            before = (torch.is_grad_enabled(), torch.is_inference_mode_enabled())
            with grad.mode(inference):
                assert torch.is_inference_mode_enabled() is inference
                assert not torch.is_grad_enabled()
            assert (torch.is_grad_enabled(), torch.is_inference_mode_enabled()) == before
