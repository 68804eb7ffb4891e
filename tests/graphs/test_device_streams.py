"""Requests on a stream of their own beside the warm-up thread's captures, on the fake device
(tests/graphs/fake_device.py): the static buffers and the kept cuBLAS workspace are touched in
one order across streams, and a measured replay times itself, not others' queued work."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from fakeclock import FakeClock

import gearshift as gs
from gearshift.graphs import AdaptiveRunner, Transform
from gearshift.graphs import device as device_module
from gearshift.graphs.measure import Meter
from gearshift.graphs.pool import GraphResourcePool
from graphs.fake_device import FakeCuda

H = 16


@pytest.fixture(autouse=True)
def no_stuck_pools() -> Iterator[None]:
    yield
    device_module._STUCK.clear()
    device_module._KEPT.clear()


def _runner(fake: FakeCuda, backend: Any) -> tuple[AdaptiveRunner, Any]:
    weight = torch.randn(H, H) / H

    def model(x: torch.Tensor) -> torch.Tensor:
        return fake.blas(lambda a: torch.tanh(a @ weight), x)  # through a cuBLAS workspace

    dims = {"BATCHSIZE": gs.Dim(gears=[2, 4, 8], max=64, splittable=True)}
    transform = Transform(model, dims, {"x": ("B", None)}, outputs=("B", None))
    runner = AdaptiveRunner(transform, {"x": torch.zeros(1, H)},
                               pool=GraphResourcePool(backend))
    return runner, model


def test_requests_on_their_own_stream_and_the_probe_and_timed_replays_run_in_one_order() -> None:
    """Every section that writes the static buffers (a request's, the padding probe's) runs in
    the device's order, and every kernel through the shared workspace (replays, timed ones,
    the primer) is ordered after the one before it: without it, a request's fill raced the
    probe's replay (a false refusal) and the probe's fill a request's replay (a wrong output)."""
    fake = FakeCuda()
    backend = fake.backend()
    runner, model = _runner(fake, backend)
    fills: list[int] = []
    fill = runner.transform.fill

    def spy(*args: Any, **kwargs: Any) -> Any:
        fills.append(backend.order._depth)
        return fill(*args, **kwargs)

    runner.transform.fill = spy  # type: ignore[method-assign]
    runner.capture([{"BATCHSIZE": 8}])
    stop, errors, wrong = threading.Event(), [], [0]

    def requests() -> None:
        with fake.stream(fake.Stream()):  # a server's own stream, not the default one
            while not stop.is_set():
                x = torch.randn(3, H)
                try:
                    if not torch.allclose(runner.run({"x": x}), model(x), atol=1e-5):
                        wrong[0] += 1
                except Exception as e:
                    errors.append(e)

    thread = threading.Thread(target=requests)
    thread.start()
    try:
        for b in (4, 2):  # captures, probes and timed replays beside the requests
            assert runner.capture([{"BATCHSIZE": b}]) == 1
    finally:
        stop.set()
        thread.join(30)
    assert errors == [] and wrong == [0] and runner.refused is None
    assert runner.stats["replays"] > 0 and fills and all(depth > 0 for depth in fills)
    assert len(runner.take_measurements()) == 3


def test_a_timed_replay_counts_the_replay_not_other_streams_queued_work() -> None:
    """A device-wide synchronize waits for every stream's queued work (here: a second each);
    the measured replay syncs its own stream, so that work is not in its seconds."""
    fake, clock = FakeCuda(), FakeClock()
    backend = fake.backend()
    device_sync = fake.synchronize

    def busy_device(index: int | None = None) -> None:
        clock.advance(1.0)  # requests' kernels queued on other streams
        device_sync(index)

    fake.synchronize = busy_device  # type: ignore[method-assign]
    graph = backend.graph(lambda: fake.op(torch.tanh, torch.ones(4)))
    graph.capture()
    cost = Meter(backend, clock, replays=3).cost(graph, 0.0, 0.0, [graph.outputs])
    assert cost is not None and cost.replay_seconds == 0.0 and cost.capture_seconds == 0.0
    assert fake.calls["replay"] == 3


def test_the_order_makes_each_block_wait_for_the_one_before_on_any_stream() -> None:
    """A block on another stream waits for the event recorded at the end of the one before it
    (and so for what that one waited for); a block inside a block is part of it."""
    fake = FakeCuda()
    backend = fake.backend()
    first, second, third = (fake.Stream() for _ in range(3))
    segment = fake.current_blas_handle().segment  # a workspace two streams share
    with fake.stream(first), backend.order.inside():
        first.use(segment)
        with backend.order.inside():  # nested: no wait, no event of its own
            first.use(segment)
    with fake.stream(second), backend.order.inside():
        second.use(segment)  # ordered after `first`'s uses
    with fake.stream(third):
        third.wait_stream(second)  # transitively after `first` too
        third.use(segment)
    with fake.stream(first), pytest.raises(RuntimeError, match="race on a cuBLAS workspace"):
        first.use(segment)  # outside the order: unordered after `third`
