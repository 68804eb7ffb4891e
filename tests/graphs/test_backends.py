"""Graph backends: the CPU graph's semantics, memory readings, unavailable devices, and the
npu backend's checks (against a stand-in torch_npu over the fake device)."""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import Callable
from multiprocessing.context import BaseContext
from typing import Any

import pytest
import torch
from shm import stream_procs
from shm.procs import WAIT, Spawn

import gearshift as gs
from gearshift.graphs import AdaptiveRunner, Transform, device, streams
from gearshift.graphs.backends import (
    CUDA_HOOKS,
    NPU_LIMIT,
    NPU_MAX_GRAPHS,
    CpuBackend,
    backend_for,
    check_allocator,
    cuda_api,
    get_backend,
    hooks,
    npu_backend,
)
from gearshift.graphs.device import DeviceBackend
from gearshift.graphs.pool import GraphLimit, GraphResourcePool
from gearshift.shm.streams import StreamLedger
from graphs.fake_device import FakeCuda


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


def _stand_in_npu(monkeypatch: pytest.MonkeyPatch, graphs: bool = True,
                  end: str = "_npu_endAllocateCurrentStreamToPool") -> FakeCuda:
    """torch_npu (a module with `_C`'s allocator hooks, `end` naming the first: torch_npu for
    torch 2.13 calls it `_npu_endAllocateToPool`) and torch.npu (the fake device)."""
    fake = FakeCuda()
    npu = types.SimpleNamespace(
        is_available=lambda: True, device_count=lambda: 1, **{
            n: getattr(fake, n) for n in (
                "device", "Stream", "stream", "current_stream", "synchronize", "empty_cache",
                "mem_get_info",
            )
        },
    )
    if graphs:
        npu.NPUGraph, npu.graph_pool_handle = fake.CUDAGraph, fake.graph_pool_handle
    c = types.SimpleNamespace(**{end: fake.end_allocate, "_npu_releasePool": fake.release_pool})
    module = types.SimpleNamespace(__version__="2.7.1" if graphs else "2.1.0", _C=c)
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    monkeypatch.setattr(torch, "npu", npu, raising=False)
    monkeypatch.delenv("TASK_QUEUE_ENABLE", raising=False)
    return fake


def test_the_npu_backend_is_the_device_backend_with_a_graph_cap(
    monkeypatch: pytest.MonkeyPatch, namespace: str
) -> None:
    fake = _stand_in_npu(monkeypatch)
    backend = npu_backend(0)
    assert (backend.kind, backend.max_graphs, backend.limit_reason) == ("npu", 1920, NPU_LIMIT)
    assert NPU_MAX_GRAPHS == 1920 and "2,048 streams" in NPU_LIMIT
    assert npu_backend(0, streams_per_graph=33).max_graphs == 1920 // 33
    assert backend.api.end_allocate == fake.end_allocate  # the recovery hooks are found
    graph = backend.graph(lambda: fake.op(lambda: torch.ones(3)))
    assert graph.capture().eq(1).all() and fake.calls["empty_cache"] == 0
    assert backend.streams is None  # no ledger installed: only this process's cap
    graph.reset()
    streams.install(lambda index: StreamLedger.open(namespace, index, streams.NPU_BUDGET))
    try:  # as connect() installs it: counted in the device's ledger until the reset
        graph = backend.graph(lambda: fake.op(lambda: torch.ones(3)))
        graph.capture()
        assert backend.streams.budget == 1920 and backend.streams.total() == 1
        graph.reset()
        assert backend.streams.total() == 0
    finally:
        streams.install(None)
        if backend.streams is not None:
            backend.streams.unlink()
            backend.streams.close()


def test_processes_on_one_npu_stop_at_its_stream_budget_together(
    namespace: str, spawn: Spawn, mp: BaseContext
) -> None:
    held, go, released, leave = mp.Event(), mp.Event(), mp.Event(), mp.Event()
    child = spawn(stream_procs.capture, namespace, 8, held, go, released, leave)
    fake = FakeCuda()
    ledger = StreamLedger.open(namespace, 0, 8)
    try:
        backend = fake.backend(kind="npu", streams=ledger, streams_per_graph=3)
        assert held.wait(WAIT)  # the other process holds two graphs: 6 of 8 streams
        assert backend.shared_room() == 0  # what a runner's room() reports: the plan stops
        graph = backend.graph(lambda: fake.op(lambda: torch.ones(2)))
        with pytest.raises(GraphLimit, match="processes hold 6 of the device's 8 streams"):
            graph.capture()
        assert fake.calls["replay"] == 0 and not fake.graph_pools()  # none tried
        assert backend.stats["budget_refusals"] == 1 and ledger.total() == 6
        go.set()
        assert released.wait(WAIT)
        assert backend.shared_room() == 1
        assert graph.capture().eq(1).all() and ledger.total() == 6
        leave.set()
        child.join(WAIT)
        assert child.exitcode == 0 and ledger.total() == 3  # the exited one's 3: cleared
    finally:
        ledger.unlink()
        ledger.close()


@pytest.mark.parametrize("end", ["_npu_endAllocateCurrentStreamToPool", "_npu_endAllocateToPool"])
def test_the_npu_hooks_are_found_under_the_name_of_either_torch_npu(
    monkeypatch: pytest.MonkeyPatch, end: str
) -> None:
    """torch_npu 2.11's name and 2.13's: without the hook a voided capture's pool would stay
    recording and no collect would empty the cache again in the process."""
    fake = _stand_in_npu(monkeypatch, end=end)
    backend = npu_backend(0)
    assert backend.api.end_allocate == fake.end_allocate
    assert backend.api.release_pool == fake.release_pool
    x = torch.ones(4)

    def syncs() -> torch.Tensor:
        if fake.capturing_here() is not None:
            fake.current_stream().synchronize()  # voids the capture
        return fake.op(lambda a: a + 1, x)

    with pytest.raises(RuntimeError, match="not permitted"):
        backend.graph(syncs).capture()
    assert backend.collect() and backend.stats["collects_skipped"] == 0
    device._STUCK.clear()
    device._KEPT.clear()


@pytest.mark.parametrize("names", [["_cuda_endAllocateToPool"],
                                   ["_cuda_endAllocateCurrentStreamToPool"], []])
def test_the_cuda_hooks_are_found_under_any_of_their_names(names: list[str]) -> None:
    c = types.SimpleNamespace(**{n: n for n in names}, _cuda_releasePool="release")
    found = hooks(c, CUDA_HOOKS)
    assert found == {"end_allocate": names[0] if names else None, "release_pool": "release",
                     "clear_workspaces": None}


def test_the_workspace_design_follows_what_the_torch_offers() -> None:
    fake = FakeCuda()
    assert DeviceBackend(cuda_api(fake), 0).workspaces.design == "kept"
    bare = types.SimpleNamespace(**{n: getattr(fake, n) for n in (
        "device", "Stream", "current_stream", "CUDAGraph")})  # an older torch: no MemPool
    api = cuda_api(bare)
    assert (api.mem_pool, api.use_mem_pool, api.prime_workspace) == (None, None, None)
    assert DeviceBackend(api, 0).workspaces.design == "per_graph"


def test_the_cuda_malloc_async_allocator_is_refused_with_what_to_do() -> None:
    check_allocator(FakeCuda())  # the native one
    with pytest.raises(gs.BackendUnavailable, match="cudaMallocAsync allocator backend") as e:
        check_allocator(FakeCuda(allocator="cudaMallocAsync"))
    assert "PYTORCH_CUDA_ALLOC_CONF" in str(e.value)


def test_npu_refuses_task_queue_level_2_and_a_torch_npu_without_graphs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _stand_in_npu(monkeypatch)
    monkeypatch.setenv("TASK_QUEUE_ENABLE", "2")
    with pytest.raises(gs.BackendUnavailable, match="TASK_QUEUE_ENABLE=1"):
        npu_backend(0)
    _stand_in_npu(monkeypatch, graphs=False)
    with pytest.raises(gs.BackendUnavailable, match=r"torch_npu 2.1.0 has no torch.npu.NPUGraph"):
        npu_backend(0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_reports_its_memory() -> None:
    free, total = get_backend("cuda").mem_get_info()
    assert 0 < free <= total


# hazards beside a capture (docs/architecture.md, "Hazards on the device"), on the fake device


def _beside_recording(fake: FakeCuda, backend: Any, beside: Callable[[], object]) -> list[Any]:
    """Capture a graph on this thread; while it records, `beside()` runs on another thread,
    which this one lets run until it ends or waits for the capture window. Returns what
    `beside` returned or raised (after the capture, which must succeed)."""
    x, got = torch.randn(2, 8), []

    def run() -> None:
        try:
            got.append(beside())
        except Exception as e:
            got.append(e)

    def body() -> torch.Tensor:
        if fake.capturing_here() is not None:  # the recorded run
            thread = threading.Thread(target=run)
            thread.start()
            while thread.is_alive() and not device.GUARD.blocked:
                thread.join(0.001)
            threads.append(thread)
        return fake.op(lambda a: a * 2, x)

    threads: list[threading.Thread] = []
    graph = backend.graph(body)
    graph.capture()
    for thread in threads:
        thread.join(10)
    graph.replay()
    torch.testing.assert_close(graph.outputs, x * 2)
    return got


def test_a_release_beside_a_capture_waits_for_it_instead_of_voiding_it() -> None:
    fake = FakeCuda()
    backend = fake.backend()
    pool = GraphResourcePool(backend)
    old = backend.graph(lambda: fake.op(torch.tanh, torch.ones(3)))
    old.capture()
    key = pool.register(old)
    assert _beside_recording(fake, backend, lambda: pool.remove_by_keys([key])) == [1]
    assert backend.stats["captures"] == 2 and backend.stats["capture_failures"] == 0


@pytest.mark.parametrize("version", ["2.11", "2.13"])
def test_replays_and_sampling_beside_a_capture_wait_for_its_window(version: str) -> None:
    fake = FakeCuda(torch=version)
    backend = fake.backend()
    live = backend.graph(lambda: fake.op(torch.tanh, torch.ones(3)))
    live.capture()
    assert _beside_recording(fake, backend, live.replay) == [None]

    def sample() -> torch.Tensor:
        with device.outside_capture():
            fake.synchronize()  # a user's device-wide sync, too
            return fake.randn(4)

    assert _beside_recording(fake, backend, sample)[0].shape == (4,)
    unguarded = _beside_recording(fake, backend, lambda: fake.randn(4))  # why the rule is
    if version == "2.11":
        assert "Offset increment outside graph capture" in str(unguarded[0])
    else:  # 2.13 keys the generator's capture states by capture id
        assert unguarded[0].shape == (4,) and fake.calls["default_stream_sync"] > 0


@pytest.mark.parametrize("version", ["2.11", "2.13"])
def test_a_collect_beside_a_capture_waits_for_it_on_either_torch(version: str) -> None:
    """2.11's allocator asserts in `empty_cache()` while any capture is underway, 2.13's only
    on the capturing stream: gearshift's collect waits for the window on both."""
    fake = FakeCuda(torch=version)
    backend = fake.backend()
    assert _beside_recording(fake, backend, backend.collect) == [True]

    def raw() -> None:
        with fake.stream(fake.Stream()):
            fake.empty_cache()

    got = _beside_recording(fake, backend, raw)  # what the window keeps out
    assert (got == [None]) == (version == "2.13"), got


def test_a_voided_capture_leaves_no_state_behind() -> None:
    fake = FakeCuda()
    backend, x = fake.backend(), torch.randn(2, 8)

    def syncs() -> torch.Tensor:
        if fake.capturing_here() is not None:
            fake.current_stream().synchronize()  # a stream sync of the capture: voids it
        return fake.op(lambda a: a + 1, x)

    with pytest.raises(RuntimeError, match="not permitted"):
        backend.graph(syncs).capture()
    assert fake.randn(4).shape == (4,)  # the default generator left capture mode
    assert not fake.recording[0] and not fake.captures and backend.collect()
    assert not fake.graph_pools()
    graph = backend.graph(lambda: fake.op(lambda a: a * 3, x))
    graph.capture()
    graph.replay()
    torch.testing.assert_close(graph.outputs, x * 3)


def test_a_capture_out_of_device_streams_is_refused_until_a_release() -> None:
    fake = FakeCuda()
    backend = fake.backend(kind="npu", max_graphs=100, limit_reason=NPU_LIMIT)
    pool = GraphResourcePool(backend)
    kept = backend.graph(lambda: fake.op(torch.tanh, torch.ones(3)))
    kept.capture()
    key = pool.register(kept)

    def out_of_streams() -> torch.Tensor:
        if fake.capturing_here() is not None:
            raise RuntimeError("ACL error 207008: Stream resources are insufficient")
        return fake.op(torch.tanh, torch.ones(3))

    refused = backend.graph(out_of_streams)
    with pytest.raises(GraphLimit, match="no stream left") as e:
        refused.capture()
    refused.reset()  # what the runner does after a failed capture: no room is back
    assert "2,048 streams" in str(e.value) and backend.stats["stream_refusals"] == 1
    tries = backend.stats["capture_failures"]
    with pytest.raises(GraphLimit, match="want of streams"):
        pool.admit()
    with pytest.raises(GraphLimit, match="want of streams"):
        backend.graph(out_of_streams).capture()
    assert backend.stats["capture_failures"] == tries  # refused, not tried
    pool.remove_by_keys([key])
    pool.admit()
    backend.graph(lambda: fake.op(torch.tanh, torch.ones(3))).capture()


def test_a_run_inside_outside_capture_does_not_deadlock_with_a_capture_and_a_request() -> None:
    """Lock order: the capture window before the runner's lock. A holds the window (a user's
    sampling step), a capture waits for it, B's request then waits for the capture: A's own
    request must still get through (B must not hold the runner's lock meanwhile)."""
    fake = FakeCuda()
    backend = fake.backend()
    dims = {"BATCHSIZE": gs.Dim(gears=[2, 4], max=4)}
    transform = Transform(lambda x: fake.op(torch.tanh, x), dims, {"x": ("B", None)},
                             outputs=("B", None))
    r = AdaptiveRunner(transform, {"x": torch.zeros(1, 8)}, pool=GraphResourcePool(backend))
    r.capture([{"BATCHSIZE": 2}])
    x, inside, go, done = torch.randn(2, 8), threading.Event(), threading.Event(), []
    guard = device.GUARD

    def user_a() -> None:
        with device.outside_capture():
            inside.set()
            go.wait(10)
            r.run({"x": x})
        done.append("a")

    def wait_for(condition: Callable[[], bool]) -> None:
        for _ in range(10_000):
            if condition():
                return
            threading.Event().wait(0.001)
        raise AssertionError("timed out")

    a = threading.Thread(target=user_a, daemon=True)
    a.start()
    assert inside.wait(10)
    w = threading.Thread(target=lambda: done.append(r.capture([{"BATCHSIZE": 4}])), daemon=True)
    w.start()
    wait_for(lambda: guard._waiting == 1)  # the capture waits for A's window
    b = threading.Thread(target=lambda: done.append(r.run({"x": x}) is not None), daemon=True)
    b.start()
    wait_for(lambda: guard.blocked == 1)  # B waits for the capture
    go.set()
    for t in (a, w, b):
        t.join(10)
    assert sorted(map(str, done)) == ["1", "True", "a"]
