"""GraphResourcePool: keys per thread, release after a synchronize then one collect, the cap;
and the key–gear index."""

from __future__ import annotations

import threading

import pytest
import torch

from gearshift.graphs.backends import CpuBackend
from gearshift.graphs.pool import GraphLimit, GraphResourcePool
from graphs.fake_device import FakeCuda


class Resource:
    def __init__(self, log: list[str], method: str = "reset") -> None:
        self.log = log
        setattr(self, method, lambda: log.append(method))


class SyncCounter(CpuBackend):
    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log

    def synchronize(self) -> None:
        self.log.append("sync")

    def collect(self) -> bool:
        self.log.append("collect")
        return True


def test_get_pool_is_a_per_device_singleton() -> None:
    assert GraphResourcePool.get_pool(0) is GraphResourcePool.get_pool(0)
    assert GraphResourcePool.get_pool(0) is not GraphResourcePool.get_pool(1)


def test_keys_are_unique_across_threads() -> None:
    pool = GraphResourcePool(CpuBackend())
    barrier = threading.Barrier(4)
    got: dict[int, list[int]] = {}

    def worker(i: int) -> None:
        barrier.wait()
        got[i] = [pool.register(Resource([])) for _ in range(50)]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    all_keys = [k for registered in got.values() for k in registered]
    assert len(set(all_keys)) == 200 and len(pool) == 200


def test_remove_by_keys_is_idempotent_and_synchronizes_first() -> None:
    log: list[str] = []
    pool = GraphResourcePool(SyncCounter(log))
    a = pool.register(Resource(log, "release"))
    b = pool.register(Resource(log, "reset"))
    assert pool.remove_by_keys([a, b, 999]) == 2
    assert log == ["sync", "release", "reset", "collect"]
    assert pool.remove_by_keys([a, b]) == 0  # already gone: no release, no sync, no collect
    assert log == ["sync", "release", "reset", "collect"] and len(pool) == 0


def test_the_cap_comes_from_the_backend_and_admit_refuses_past_it() -> None:
    backend = CpuBackend()
    assert GraphResourcePool(backend).max_graphs is None
    backend.max_graphs, backend.limit_reason = 2, "two streams"
    pool = GraphResourcePool(backend)
    assert pool.max_graphs == 2 and GraphResourcePool(backend, None).max_graphs is None
    pool.admit(2)
    pool.register(Resource([]))
    pool.admit()
    pool.register(Resource([]))
    with pytest.raises(GraphLimit, match="cpu:0 holds 2 graphs, its cap being 2: two streams"):
        pool.admit()


def test_releases_of_one_tick_give_their_memory_back_in_one_empty_cache() -> None:
    """Several gears released together (a profile's tick: `collecting()`) run one
    `empty_cache()`, after the last release, not one each."""
    fake = FakeCuda()
    backend = fake.backend()
    pool = GraphResourcePool(backend)
    keys = []
    for i in range(3):
        graph = backend.graph(lambda i=i: fake.op(lambda: torch.full((4,), float(i))))
        graph.capture()
        keys.append(pool.register(graph))
    before = fake.calls["empty_cache"]
    with backend.collecting():
        assert [pool.remove_by_keys([k]) for k in keys] == [1, 1, 1]
        assert fake.calls["empty_cache"] == before and fake.graph_pools()  # not yet
    assert fake.calls["empty_cache"] == before + 1 and not fake.graph_pools()
    with backend.collecting():
        pass  # nothing released: nothing to collect
    assert fake.calls["empty_cache"] == before + 1 and backend.collect()
