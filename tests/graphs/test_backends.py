"""Graph backends: the CPU graph's semantics, memory readings, and unavailable devices."""

from __future__ import annotations

import pytest
import torch

import gearshift as gs
from gearshift.graphs.backends import CpuBackend, backend_for, get_backend


def test_cpu_graph_replays_on_the_static_buffers() -> None:
    static = torch.zeros(4)
    graph = CpuBackend().graph(lambda: {"y": static * 2})
    out = graph.capture()
    assert graph.outputs is out and out["y"].eq(0).all()
    y = out["y"]
    static.fill_(3)
    graph.replay()
    assert graph.outputs["y"] is y and y.eq(6).all()  # same tensor, rewritten
    graph.reset()
    assert graph.outputs is None


def test_cpu_graph_runs_without_autograd() -> None:
    layer = torch.nn.Linear(2, 2)
    static = torch.zeros(3, 2)
    graph = CpuBackend().graph(lambda: layer(static))
    assert not graph.capture().requires_grad
    graph.replay()
    assert graph.outputs.grad_fn is None


def test_cpu_memory_reading_is_configurable() -> None:
    backend = CpuBackend()
    free, total = backend.mem_get_info()
    assert 0 < free <= total
    backend.memory = (10, 100)
    assert backend.mem_get_info() == (10, 100)
    backend.memory = lambda: (5, 100)
    assert backend.mem_get_info() == (5, 100)


def test_backend_lookup() -> None:
    assert get_backend("cpu") is backend_for("cpu") is backend_for(torch.device("cpu"))
    assert backend_for("cpu:1").index == 1
    with pytest.raises(gs.ConfigError, match="unknown backend"):
        get_backend("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_cuda_unavailable_is_a_clear_error() -> None:
    with pytest.raises(gs.BackendUnavailable, match="cuda"):
        backend_for("cuda:0")


def test_npu_without_torch_npu_is_a_clear_error() -> None:
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        with pytest.raises(gs.BackendUnavailable, match="torch_npu"):
            backend_for("npu:0")
    else:
        pytest.skip("torch_npu is installed")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_graph_runner_matches_eager() -> None:
    layer = torch.nn.Linear(8, 8).cuda()
    runner = gs.GraphRunner(lambda x: torch.relu(layer(x)), [1, 4, 16], hidden=8, device="cuda")
    runner.capture()
    for bs in (3, 16, 1, 4):
        x = torch.randn(bs, 8, device="cuda")
        torch.testing.assert_close(runner.run(x), torch.relu(layer(x)))
    assert runner.stats["replays"] == 4
    free, total = get_backend("cuda").mem_get_info()
    assert 0 < free <= total
