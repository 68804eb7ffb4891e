"""The same pool and release tests on every backend: cpu, the fake cuda and npu
(tests/graphs/fake_device.py), and the real cuda when this machine has one. A device backend
gives every graph's memory back to the device when its gear is released."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

import gearshift as gs
from gearshift.graphs import AdaptiveRunner, Transform
from gearshift.graphs import device as device_module
from gearshift.graphs.backends import NPU_LIMIT, Backend, CpuBackend, cuda_backend
from gearshift.graphs.pool import GraphLimit, GraphResourcePool
from graphs.fake_device import FakeCuda, MiB
from graphs.fake_parts import WORKSPACE

H = 32
Op = Callable[..., torch.Tensor]


@dataclass
class Device:
    backend: Backend
    op: Op  # runs one kernel (the fake device allocates its output and records it)
    blas: Op  # runs one kernel that multiplies matrices (on the fake: through a workspace)
    where: str  # the torch device of the tensors
    memory: bool  # the backend holds device memory (mem_get_info moves with graphs)


def _plain(fn: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
    return fn(*args)


@pytest.fixture(params=["cpu", "fake-cuda", "fake-cuda-2.13", "fake-cuda-per_graph", "fake-npu",
                        "cuda"])
def dev(request: pytest.FixtureRequest) -> Iterator[Device]:
    if request.param == "cpu":
        yield Device(CpuBackend(), _plain, _plain, "cpu", False)
    elif request.param.startswith("fake"):
        _, kind, *rest = request.param.split("-")
        fake = FakeCuda(torch="2.13" if rest == ["2.13"] else "2.11")
        options: dict[str, Any] = {"design": "per_graph" if rest == ["per_graph"] else "kept"}
        if kind == "npu":
            options |= {"max_graphs": 1800, "limit_reason": NPU_LIMIT}
        yield Device(fake.backend(kind=kind, **options), fake.op, fake.blas, "cpu", True)
    elif not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    else:
        yield Device(cuda_backend(0), _plain, _plain, "cuda", True)
    device_module._STUCK.clear()


def make(
    dev: Device, max_graphs: int | None = -1, spy: Callable[[torch.Tensor], None] = lambda x: None
) -> tuple[AdaptiveRunner, Callable]:
    """The runner, and its model; `spy(x)` is called on every input `x` the model gets."""
    torch.manual_seed(0)
    weight = torch.randn(H, 4 * H, device=dev.where) / H

    @torch.no_grad()
    def model(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        spy(x)
        h = dev.blas(lambda a: torch.tanh(a @ weight), x)  # [B, S, 4H]: an intermediate
        return dev.op(lambda a, m: a[..., :H] * m.unsqueeze(-1), h, mask)

    dims = {
        "BATCHSIZE": gs.Dim(gears=[2, 4, 8], max=64, splittable=True),
        "SEQLEN": gs.Dim(gears=[64, 256], max=256),
    }
    inputs = {"x": ("B", "S", None), "mask": ("B", "S")}
    transform = Transform(model, dims, inputs, outputs=("B", "S", None))
    example = {"x": torch.zeros(1, 1, H, device=dev.where)}
    example["mask"] = torch.ones(1, 1, device=dev.where)
    pool = GraphResourcePool(dev.backend, max_graphs)
    return AdaptiveRunner(transform, example, pool=pool), model


def call(dev: Device, b: int, s: int) -> dict[str, torch.Tensor]:
    x = torch.randn(b, s, H, device=dev.where)
    return {"x": x, "mask": torch.ones(b, s, device=dev.where)}


def variants(r: AdaptiveRunner) -> list[dict[str, int]]:
    return [{"BATCHSIZE": b, "SEQLEN": s} for b in r.gears["BATCHSIZE"] for s in r.gears["SEQLEN"]]


def free(dev: Device) -> int:
    dev.backend.collect()  # what is cached outside the graphs' pools goes first
    return dev.backend.mem_get_info()[0]


def test_replays_equal_eager_and_a_release_drops_every_graph_of_the_gear(dev: Device) -> None:
    r, model = make(dev)
    assert r.capture(variants(r)) == 6 and len(r.pool) == 6
    for b, s in [(1, 1), (3, 200), (8, 64), (13, 70)]:
        t = call(dev, b, s)
        torch.testing.assert_close(r.run(t), model(**t))
    assert r.stats["eager"] == 0 and r.stats["replays"] == 5  # 13 = 8 + 8
    assert r.release("SEQLEN", 64) == 3 and len(r.pool) == 3
    assert r.ready() == [(2, 256), (4, 256), (8, 256)]
    t = call(dev, 3, 10)  # runs on (4, 256) now
    torch.testing.assert_close(r.run(t), model(**t))
    assert r.release("BATCHSIZE", 2) == 1 and r.release("BATCHSIZE", 2) == 0


def test_a_release_gives_the_graphs_memory_back_to_the_device(dev: Device) -> None:
    """Each graph's bytes (the device's free memory it took) and what a release returns agree
    within the readings' 2 MiB steps: the workspace the padding probe's eager run made on this
    thread is lasting state, which no capture frees (it did: each graph then read a workspace
    too small, and the release returned one more than they held)."""
    if not dev.memory:
        pytest.skip("the cpu backend holds no device memory")
    if getattr(getattr(dev.backend, "workspaces", None), "design", None) == "per_graph":
        pytest.skip("per_graph clears every workspace at each capture: lasting ones too")
    r, _ = make(dev)
    r.capture([{"BATCHSIZE": 2, "SEQLEN": 64}])  # the first kernels make lasting state
    r.release("BATCHSIZE", 2)  # (cuBLAS handles, modules): not a graph's memory
    held = {}
    for v in sorted(variants(r), key=lambda v: -v["BATCHSIZE"] * v["SEQLEN"]):
        before = free(dev)
        r.capture([v])
        held[v["BATCHSIZE"], v["SEQLEN"]] = before - free(dev)
    assert min(held.values()) > 0
    before = free(dev)
    assert r.release("SEQLEN", 256) == 3
    returned = dev.backend.mem_get_info()[0] - before  # the release collected already
    expected = sum(n for (_, s), n in held.items() if s == 256)
    slack = 3 * (2 << 20)  # 2 MiB a graph: readings in 2 MiB steps, graphs' execs beside pools
    assert abs(returned - expected) <= slack, (returned, expected)
    assert r.release("SEQLEN", 64) == 3 and free(dev) - before == pytest.approx(
        sum(held.values()), abs=2 * slack
    )


def test_a_full_pool_refuses_with_the_reason_and_room_says_so(dev: Device) -> None:
    r, _ = make(dev, max_graphs=4)
    assert r.room() == (4, getattr(dev.backend, "limit_reason", "") or "the pool's max_graphs")
    with pytest.raises(GraphLimit, match="holds 4 graphs, its cap being 4"):
        r.capture(variants(r))
    assert len(r.pool) == 4 and r.room()[0] == 0
    r.release("BATCHSIZE", 8)
    assert r.room()[0] == 2 and r.capture([{"BATCHSIZE": b, "SEQLEN": 64} for b in (2, 4)]) == 2
    assert r.room()[0] == 0


def test_the_npu_cap_says_why() -> None:
    fake = FakeCuda()
    backend = fake.backend(kind="npu", max_graphs=1800, limit_reason=NPU_LIMIT)
    pool = GraphResourcePool(backend)
    assert pool.max_graphs == 1800
    pool.max_graphs = 0
    with pytest.raises(GraphLimit, match="2,048 streams") as e:
        pool.admit()
    assert "product of its gear counts" in str(e.value)


def test_a_failed_capture_keeps_nothing_and_is_counted(dev: Device) -> None:
    r, model = make(dev)
    broken = {"on": True}
    fn = r.transform.fn

    def flaky(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if broken["on"] and x.shape[0] == 8:
            raise RuntimeError("kernel launch failed")
        return fn(x, mask)

    r.transform.fn = flaky
    with pytest.raises(RuntimeError, match="kernel launch failed"):
        r.capture([{"BATCHSIZE": 8, "SEQLEN": 64}])
    assert r.stats["capture_failures"] == 1 and r.ready() == [] and len(r.pool) == 0
    broken["on"] = False
    assert r.capture([{"BATCHSIZE": 8, "SEQLEN": 64}]) == 1
    t = call(dev, 5, 9)
    torch.testing.assert_close(r.run(t), model(**t))


# cuBLAS-like workspaces (docs/architecture.md, "Hazards on the device"), on the fake device


def _gemm_graphs(fake: FakeCuda, warmup: int, n: int = 3,
                 design: str = "kept") -> tuple[Any, list[Any], torch.Tensor]:
    backend, w = fake.backend(warmup=warmup, design=design), torch.randn(8, 8)
    xs = [torch.randn(m, 8) for m in range(1, n + 1)]
    graphs = [backend.graph(lambda x=x: fake.op(torch.tanh, fake.gemm(x, w))) for x in xs]
    for graph in graphs:
        graph.capture()
    return backend, list(zip(graphs, xs, strict=True)), w


@pytest.mark.parametrize("design", ["kept", "per_graph"])
@pytest.mark.parametrize("warmup", [0, 2])
def test_a_release_leaves_the_surviving_graphs_workspaces_alone(warmup: int, design: str) -> None:
    fake = FakeCuda()
    backend, graphs, w = _gemm_graphs(fake, warmup, design=design)
    pool = GraphResourcePool(backend)
    keys = [pool.register(g) for g, _ in graphs]
    assert pool.remove_by_keys(keys[:1]) == 1  # its reset clears its stream's workspace
    fake.clear_workspaces()  # and anyone's clear: no survivor recorded with a shared one
    for graph, x in graphs[1:]:
        x.mul_(-1)
        graph.replay()
        torch.testing.assert_close(graph.outputs, torch.tanh(x @ w))


def test_warm_ups_never_run_through_a_live_graphs_workspace() -> None:
    fake = FakeCuda()
    _, graphs, w = _gemm_graphs(fake, warmup=2)  # each warm-up after the first graph's
    for graph, x in graphs:
        graph.replay()
        torch.testing.assert_close(graph.outputs, torch.tanh(x @ w))


@pytest.mark.parametrize("design", ["kept", "per_graph"])
def test_a_graphs_pool_holds_its_workspace_only_per_graph_and_returns_with_it(
    design: str,
) -> None:
    fake = FakeCuda()
    backend, graphs, _ = _gemm_graphs(fake, warmup=2, n=2, design=design)
    backend.collect()
    free = backend.mem_get_info()[0]
    held = fake.pool_bytes(graphs[0][0].graph.pool())
    if design == "per_graph":
        assert held >= WORKSPACE  # its workspace's segment is in its own pool
    else:  # its activations; the workspace is the backend's, once
        assert held == 2 * MiB and fake.pool_bytes(backend.workspaces.pool.id) == WORKSPACE
    graphs[0][0].reset()
    backend.collect()
    assert abs(backend.mem_get_info()[0] - free - held) <= 2 << 20  # a 2 MiB reading step


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_cuda_a_release_leaves_the_survivors_equal_to_eager() -> None:
    backend, w = cuda_backend(0), torch.randn(4096, 4096, device="cuda") / 64
    xs = {m: torch.randn(m, 4096, device="cuda") for m in (1, 16, 64)}  # split-K sizes
    pool = GraphResourcePool(backend)
    graphs = {m: backend.graph(lambda m=m: xs[m] @ w) for m in xs}
    keys = {m: (g.capture(), pool.register(g))[1] for m, g in graphs.items()}
    assert pool.remove_by_keys([keys[64]]) == 1
    torch._C._cuda_clearCublasWorkspaces()
    for m in (1, 16):
        graphs[m].replay()
        torch.testing.assert_close(graphs[m].outputs, xs[m] @ w, rtol=1e-3, atol=1e-3)


def test_static_buffers_shrink_once_the_largest_gear_is_released(dev: Device) -> None:
    """What the graphs read (the storage under each `x` the model gets, which a live static
    buffer keeps): one buffer for 8 x 256 rows, then, once 8 goes, one for 4 x 256 and the
    first one freed."""
    read: list[weakref.ref] = []  # the storage under x, at each call of the model
    r, model = make(dev, spy=lambda x: read.append(weakref.ref(x.untyped_storage())))

    def buffers() -> set[int]:  # the sizes of those still alive, in rows of H floats
        return {s.nbytes() // (H * 4) for s in (ref() for ref in read) if s is not None}

    assert r.capture(variants(r)) == 6
    assert buffers() == {8 * 256}
    (big,) = {ref() for ref in read} - {None}
    big_ref = weakref.ref(big)
    del big
    read.clear()
    r.gears = {"BATCHSIZE": (2, 4), "SEQLEN": (64, 256)}  # a new gear set, 8 gone
    assert r.release("BATCHSIZE", 8) == 2
    assert r.capture([]) == 0  # the warm-up thread's next call re-stages the survivors
    gc.collect()
    assert big_ref() is None and buffers() == {4 * 256}
    assert len(r.pool) == 4 and r.ready() == [(2, 64), (2, 256), (4, 64), (4, 256)]
    for b, s in [(1, 1), (3, 200), (4, 64)]:
        t = call(dev, b, s)
        torch.testing.assert_close(r.run(t), model(**t))
    assert r.stats["eager"] == 0
