"""The device backend against the fake `torch.cuda` (tests/graphs/fake_device.py): what the fake
models of the allocator, and that the backend's pools, captures and failures respect it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from gearshift.graphs import device
from graphs.fake_device import FakeCuda, MiB, segment_size

W = torch.randn(64, 64)


@pytest.fixture(autouse=True)
def no_stuck_pools() -> Iterator[None]:
    yield
    device._STUCK.clear()  # process-wide: a test that leaves a pool stuck must not spill over
    device._KEPT.clear()


def body(fake: FakeCuda, x: torch.Tensor) -> torch.Tensor:
    """Two kernels: an intermediate (freed into the pool) and the output (kept)."""
    h = fake.op(lambda a: torch.tanh(a @ W), x)
    return fake.op(lambda a: a * 2, h)


def blob(fake: FakeCuda, nbytes: int) -> torch.Tensor:
    return fake.op(lambda: torch.zeros(nbytes, dtype=torch.uint8))


def free(fake: FakeCuda) -> int:
    """The allocator's free bytes, exactly (the device's reading is in 2 MiB steps)."""
    return fake.total - fake.reserved()


def capture(fake: FakeCuda, graph: object, x: torch.Tensor, pool: object = None) -> torch.Tensor:
    with fake.stream(fake.Stream()):
        graph.capture_begin(pool=pool)
        out = body(fake, x)
        graph.capture_end()
    return out


# what the fake models


def test_segments_are_sized_as_the_allocator_sizes_them() -> None:
    assert segment_size(100) == 2 * MiB and segment_size(MiB) == 2 * MiB
    assert segment_size(MiB + 1) == 20 * MiB and segment_size(12 * MiB + 1) == 14 * MiB


def test_reset_frees_nothing_until_empty_cache_then_the_pool_id_is_gone() -> None:
    fake = FakeCuda()
    x, graph = torch.randn(4, 64), fake.CUDAGraph()
    free0 = free(fake)
    out = capture(fake, graph, x)
    x.fill_(1.0)
    graph.replay()
    torch.testing.assert_close(out, torch.tanh(x @ W) * 2)
    held = free0 - free(fake)
    assert held == 2 * MiB  # intermediate and output share one small segment of the pool
    del out
    graph.reset()
    assert free(fake) == free0 - held  # freeable, not freed
    fake.empty_cache()
    assert free(fake) == free0 and not fake.graph_pools()


def test_a_shared_pool_whose_graphs_are_all_gone_cannot_be_captured_into() -> None:
    fake = FakeCuda()
    pool, x = fake.graph_pool_handle(), torch.randn(2, 64)
    first = fake.CUDAGraph()
    capture(fake, first, x, pool)
    first.reset()  # use count 0, not yet erased
    with pytest.raises(RuntimeError, match="use_count > 0"):
        capture(fake, fake.CUDAGraph(), x, pool)


def test_empty_cache_during_a_capture_asserts_and_one_capture_per_process() -> None:
    fake = FakeCuda()
    graph = fake.CUDAGraph()
    with fake.stream(fake.Stream()):
        graph.capture_begin()
        with pytest.raises(RuntimeError, match=r"captures_underway\.empty"):
            fake.empty_cache()
        with pytest.raises(RuntimeError, match="only one"):
            fake.CUDAGraph().capture_begin()
        graph.capture_end()
    with pytest.raises(RuntimeError, match="non-default stream"):
        fake.CUDAGraph().capture_begin()


def test_the_torch_context_manager_empties_the_cache_beside_another_capture() -> None:
    fake = FakeCuda()
    began, done, ended = threading.Event(), threading.Event(), []

    def background() -> None:
        graph = fake.CUDAGraph()
        with fake.stream(fake.Stream()):
            graph.capture_begin(capture_error_mode="thread_local")
            began.set()
            done.wait(10)
            try:
                graph.capture_end()
            except RuntimeError as e:
                ended.append(e)

    thread = threading.Thread(target=background)
    thread.start()
    assert began.wait(10)
    try:
        with pytest.raises(RuntimeError, match="not permitted"), fake.graph(fake.CUDAGraph()):
            pass  # its synchronize() voids the other capture; empty_cache() would assert
        with pytest.raises(RuntimeError, match=r"captures_underway\.empty"):
            fake.empty_cache()
    finally:
        done.set()
        thread.join(10)
    assert fake.calls["graph_context"] == 1 and fake.calls["empty_cache"] == 1
    assert "Invalidated" in str(ended[0])  # the other capture, voided


def test_a_voided_capture_leaves_its_pool_recording_until_the_allocator_hooks_end_it() -> None:
    fake = FakeCuda()
    graph = fake.CUDAGraph()
    with fake.stream(fake.Stream()):
        graph.capture_begin()
        with pytest.raises(RuntimeError, match="not permitted"):
            fake.synchronize()
        with pytest.raises(RuntimeError, match="Invalidated"):
            graph.capture_end()
    assert fake.recording[0] == [graph.pool_id]
    with pytest.raises(RuntimeError, match=r"captures_underway\.empty"):
        fake.empty_cache()
    fake.end_allocate(0, graph.pool_id)
    fake.release_pool(0, graph.pool_id)
    fake.empty_cache()
    assert not fake.graph_pools()


@pytest.mark.parametrize("mode", ["global", "thread_local"])
def test_requests_allocating_during_a_capture_fail_it_only_in_global_mode(mode: str) -> None:
    fake = FakeCuda()
    graph, errors = fake.CUDAGraph(), []

    def request() -> None:
        try:
            blob(fake, 1000)  # a new segment, on the default stream
        except RuntimeError as e:
            errors.append(e)

    with fake.stream(fake.Stream()):
        graph.capture_begin(capture_error_mode=mode)
        thread = threading.Thread(target=request)
        thread.start()
        thread.join(10)
        if mode == "global":
            with pytest.raises(RuntimeError, match="Invalidated"):
                graph.capture_end()
        else:
            graph.capture_end()
    assert len(errors) == (mode == "global")


def test_while_a_pool_records_an_allocation_gets_no_free_and_retry() -> None:
    fake = FakeCuda(total=64 * MiB)
    blobs = [blob(fake, MiB) for _ in range(60)]  # 30 small segments, two blobs each
    del blobs[:20]  # 10 of them cached, free: a free-and-retry would make room for 20 MiB
    graph, failed = fake.CUDAGraph(), []

    def request() -> None:
        try:
            blob(fake, 2 * MiB)  # a large block: a new 20 MiB segment
        except torch.OutOfMemoryError as e:
            failed.append(e)

    with fake.stream(fake.Stream()):
        graph.capture_begin(capture_error_mode="thread_local")
        thread = threading.Thread(target=request)
        thread.start()
        thread.join(10)
        graph.capture_end()
    assert len(failed) == 1
    request()  # no capture underway: the cache is emptied and the allocation retried
    assert len(failed) == 1 and fake.reserved() == 40 * MiB + 20 * MiB


# the backend on the fake


def test_the_backend_captures_on_its_own_stream_without_sync_or_empty_cache() -> None:
    fake = FakeCuda(devices=2)
    backends = [fake.backend(0), fake.backend(1)]
    assert backends[0].stream is not backends[1].stream
    assert [b.stream.device for b in backends] == [0, 1]
    x = torch.randn(2, 64)
    graphs = [b.graph(lambda b=b: body(fake, x)) for b in backends for _ in range(2)]
    for g in graphs:
        g.capture()
    assert fake.calls["synchronize"] == fake.calls["empty_cache"] == 0
    assert fake.calls["graph_context"] == 0
    pools = [g.graph.pool() for g in graphs]
    assert len(set(pools)) == 4  # a pool per graph
    assert [g.graph.device for g in graphs] == [0, 0, 1, 1]
    x.fill_(0.5)
    graphs[3].replay()
    torch.testing.assert_close(graphs[3].outputs, torch.tanh(x @ W) * 2)


def test_a_capture_orders_the_callers_stream_and_its_own_both_ways() -> None:
    """The warm-up and capture streams wait on the caller's (its buffer writes) before `fn`
    first runs, the capture stream on the warm-ups', and the caller's waits on the capture
    stream afterwards, not before (mutations caught: any `wait_stream` dropped)."""
    fake = FakeCuda()
    backend, x = fake.backend(), torch.randn(2, 64)
    caller = fake.Stream()
    assert caller not in (backend.stream, backend.warm_stream)
    assert backend.stream is not backend.warm_stream
    runs: list[tuple[Any, bool, bool]] = []

    def fn() -> torch.Tensor:
        stream = fake.current_stream()
        runs.append((stream, caller in stream.waited, backend.stream in caller.waited))
        return body(fake, x)

    graph = backend.graph(fn)
    with fake.stream(caller):
        graph.capture()
        assert fake.current_stream() is caller
    warm, record = runs[:-1], runs[-1]
    assert len(warm) == backend.warmup and all(w == (backend.warm_stream, True, False)
                                               for w in warm)
    assert record == (backend.stream, True, False)
    assert backend.warm_stream in backend.stream.waited  # the record after the warm-ups
    assert caller.waited == [backend.stream]


def test_releasing_a_graph_returns_its_memory_through_collect() -> None:
    fake = FakeCuda()
    backend, x = fake.backend(), torch.randn(2, 64)
    keep, drop = (backend.graph(lambda: body(fake, x)) for _ in range(2))
    backend.collect()
    free0 = free(fake)
    keep.capture()
    backend.collect()  # the warm-ups' cache back: what is left is the graph's pool
    free1 = free(fake)
    drop.capture()
    backend.collect()
    held = free1 - free(fake)
    assert held == fake.pool_bytes(drop.graph.pool()) > 0
    drop.reset()
    assert backend.collect()
    kept = fake.pool_bytes(backend.workspaces.pool.id)  # the backend's workspace, made once
    assert free(fake) == free1 and free0 - free1 == fake.pool_bytes(keep.graph.pool()) + kept
    assert backend.stats["collects"] == 4


def test_a_failed_capture_gives_its_pool_back_and_the_next_one_works() -> None:
    fake = FakeCuda()
    backend, x = fake.backend(), torch.randn(2, 64)
    calls = []

    def flaky() -> torch.Tensor:
        calls.append(1)
        if len(calls) == 3:  # the recorded run (after two warm-ups)
            raise ValueError("boom")
        return body(fake, x)

    graph = backend.graph(flaky)
    with pytest.raises(ValueError, match="boom"):
        graph.capture()
    assert backend.stats["capture_failures"] == 1 and not fake.recording[0]
    assert not fake.captures and fake.freeable[0]  # ended, reset: its pool is freeable
    backend.collect()
    assert not fake.graph_pools()
    again = backend.graph(lambda: body(fake, x))
    again.capture()
    assert backend.stats["captures"] == 1


class Ledger:
    """A device's stream ledger as `graphs.streams` describes it, for this process alone."""

    def __init__(self, budget: int) -> None:
        self.budget, self.held = budget, 0

    def take(self, n: int) -> int | None:
        if self.held + n > self.budget:
            return 0  # the others hold none
        self.held += n
        return None

    def give(self, n: int) -> None:
        self.held -= n

    def total(self) -> int:
        return self.held


def test_a_failed_capture_gives_its_streams_back_to_the_devices_ledger() -> None:
    fake, ledger = FakeCuda(), Ledger(budget=6)
    backend, x = fake.backend(streams=ledger, streams_per_graph=3), torch.randn(2, 64)

    def boom() -> torch.Tensor:
        raise ValueError("boom")

    for _ in range(3):  # more failures than the budget holds graphs: none keeps a stream
        with pytest.raises(ValueError, match="boom"):
            backend.graph(boom).capture()
        assert ledger.held == 0
    graphs = [backend.graph(lambda: body(fake, x)) for _ in range(2)]
    for g in graphs:
        g.capture()
    assert ledger.held == 6 and backend.shared_room() == 0
    with pytest.raises(device.GraphLimit, match="hold 6 of the device's 6 streams"):
        backend.graph(lambda: body(fake, x)).capture()
    assert ledger.held == 6  # a capture the ledger refused took nothing
    graphs[0].reset()
    graphs[0].reset()  # a second reset gives nothing twice
    assert ledger.held == 3 and backend.shared_room() == 1


@pytest.mark.parametrize("hooks", [True, False])
def test_a_voided_capture_is_ended_by_the_hooks_else_collect_stays_off(hooks: bool) -> None:
    fake = FakeCuda()
    backend, x = fake.backend(hooks=hooks), torch.randn(2, 64)
    n = []

    def syncs() -> torch.Tensor:
        n.append(1)
        if len(n) == 3:
            fake.synchronize()  # voids the capture; torch would raise here too
        return body(fake, x)

    with pytest.raises(RuntimeError, match="not permitted"):
        backend.graph(syncs).capture()
    assert bool(fake.recording[0]) is not hooks
    assert backend.collect() is hooks
    assert backend.stats["collects_skipped"] == (not hooks)
    if hooks:
        assert not fake.graph_pools()


def test_collect_waits_for_a_capture_underway() -> None:
    fake = FakeCuda()
    backend, x = fake.backend(warmup=0), torch.randn(2, 64)
    inside, go = threading.Event(), threading.Event()

    def slow() -> torch.Tensor:
        inside.set()
        go.wait(10)
        return body(fake, x)

    thread = threading.Thread(target=backend.graph(slow).capture)
    thread.start()
    assert inside.wait(10)
    collected = []
    collector = threading.Thread(target=lambda: collected.append(backend.collect()))
    collector.start()
    collector.join(0.2)
    assert collector.is_alive() and fake.calls["empty_cache"] == 0  # waiting, not asserting
    go.set()
    thread.join(10)
    collector.join(10)
    assert collected == [True] and fake.calls["empty_cache"] == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_voided_cuda_capture_is_given_back_and_the_cache_still_empties() -> None:
    from gearshift.graphs.backends import cuda_backend

    backend = cuda_backend(0)
    x = torch.ones(1 << 20, device="cuda")

    def syncs() -> torch.Tensor:
        y = x * 2
        if torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()  # illegal while capturing: voids the capture
        return y

    with pytest.raises(RuntimeError):
        backend.graph(syncs).capture()
    assert backend.stats["capture_failures"] == 1
    assert backend.collect()  # empty_cache(), not skipped: no pool is left recording
    graph = backend.graph(lambda: x * 3)
    graph.capture()
    graph.replay()
    torch.cuda.synchronize()
    assert graph.outputs.eq(3).all() and backend.stats["captures"] == 1
