"""Every graph the adaptive runner captures is measured on the capturing thread: capture and
replay seconds on the injected clock, bytes (the pool's on a device, the static buffers' on
the cpu); a measurement that fails leaves the capture standing."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from fakeclock import FakeClock

import gearshift as gs
from gearshift.clock import MonotonicClock, ThreadCpuClock
from gearshift.graphs import AdaptiveRunner, Transform
from gearshift.graphs import device as device_module
from gearshift.graphs.backends import CpuBackend
from gearshift.graphs.measure import Meter, clock_for, static_bytes
from gearshift.graphs.pool import GraphResourcePool
from graphs.fake_device import FakeCuda, MiB

H = 8
DIMS = {"BATCHSIZE": gs.Dim(gears=[2, 4], max=64), "SEQLEN": gs.Dim(gears=[16], max=64)}
INPUTS = {"x": ("B", "S", None)}


def runner(backend: Any, clock: FakeClock, op: Callable[..., torch.Tensor] | None = None,
           seconds: float = 0.01, replays: int | None = None) -> AdaptiveRunner:
    """A runner of a function that takes `seconds` of `clock` per run (through `op`, the
    fake device's kernel, when given)."""

    @torch.no_grad()
    def fn(x: torch.Tensor) -> torch.Tensor:
        clock.advance(seconds)
        return op(torch.tanh, x) if op is not None else torch.tanh(x)

    transform = Transform(fn, DIMS, INPUTS, outputs=("B", "S", None))
    return AdaptiveRunner(transform, {"x": torch.zeros(1, 1, H)},
                             pool=GraphResourcePool(backend), clock=clock, replays=replays)


def test_a_cpu_graph_is_measured_in_the_clock_and_its_outputs_not_the_shared_inputs() -> None:
    clock = FakeClock()
    r = runner(CpuBackend(), clock)
    assert r.capture([{"BATCHSIZE": 4, "SEQLEN": 16}, {"BATCHSIZE": 2, "SEQLEN": 16}]) == 2
    (first, a), (second, b) = r.take_measurements()
    assert (first, second) == ({"BATCHSIZE": 4, "SEQLEN": 16}, {"BATCHSIZE": 2, "SEQLEN": 16})
    # two runs of fn: the capture's, on the padding probe's padded input (the probe's padded
    # run, timed as the replay), and the probe's eager run; no replay of its own
    assert a.capture_seconds == pytest.approx(0.02)
    assert a.replay_seconds == pytest.approx(0.01)  # the capture's run (CPU_REPLAYS: one)
    # what each graph alone holds: its output, float32; its input is a view of the static
    # buffer both graphs share (sized by the largest), which no graph's bytes count
    assert a.graph_bytes == 4 * 16 * H * 4
    assert b.graph_bytes == 2 * 16 * H * 4
    assert r.take_measurements() == []  # taken once
    assert r.stats["replays"] == 0  # timed replays are not requests' replays


def test_a_cpu_graph_whose_gears_were_probed_before_times_its_capture_as_the_replay() -> None:
    clock = FakeClock()
    r = runner(CpuBackend(), clock)
    assert r.capture([{"BATCHSIZE": 4, "SEQLEN": 16}]) == 1
    r.take_measurements()
    r.release("BATCHSIZE", 4)
    assert r.capture([{"BATCHSIZE": 4, "SEQLEN": 16}]) == 1  # no probe: it passed before
    ((_, cost),) = r.take_measurements()
    assert cost.capture_seconds == pytest.approx(0.01)  # one run of fn: the capture's
    assert cost.replay_seconds == pytest.approx(0.01)  # timed as the replay


def test_a_cpu_graph_is_timed_in_cpu_seconds_by_default_a_device_graph_on_the_wall() -> None:
    fake = FakeCuda()
    assert isinstance(clock_for(CpuBackend()), ThreadCpuClock)
    assert isinstance(clock_for(fake.backend()), MonotonicClock)
    assert isinstance(Meter(CpuBackend()).clock, ThreadCpuClock)
    # a thread's CPU seconds do not pass while it waits (as while other processes run)
    cpu = ThreadCpuClock()
    began = cpu.now()
    time.sleep(0.05)
    assert cpu.now() - began < 0.02 and cpu.now_ns() >= int(began * 1e9)
    deadline = time.monotonic() + 10.0  # ... and do while it computes
    while cpu.now() - began < 0.03 and time.monotonic() < deadline:
        sum(range(1000))
    assert cpu.now() - began >= 0.03


def test_a_device_graph_counts_its_warm_up_and_its_pool() -> None:
    fake, clock = FakeCuda(), FakeClock()
    backend = fake.backend()
    r = runner(backend, clock, fake.op)
    assert r.capture([{"BATCHSIZE": 4, "SEQLEN": 16}]) == 1
    ((_, cost),) = r.take_measurements()
    # two warm-up runs, the recording and the probe's eager run; the replays (the probe's,
    # the timed ones) run no Python here
    assert cost.capture_seconds == pytest.approx(0.04)
    assert cost.replay_seconds == 0.0  # a replay runs the recorded kernels, not fn's Python
    (pool,) = fake.graph_pools()  # the graph's own
    # its pool (outputs included), not its input view of the shared static buffer
    assert cost.graph_bytes == fake.pool_bytes(pool) == 2 * MiB
    assert fake.calls["synchronize"] >= 2  # the capture, between two device synchronizes
    assert fake.calls["stream_synchronize"] >= 2 * 3  # each timed replay: its stream's
    device_module._STUCK.clear()


def test_replays_zero_measures_nothing_and_a_failed_replay_keeps_the_graph() -> None:
    clock = FakeClock()
    quiet = runner(CpuBackend(), clock, replays=0)
    assert quiet.capture([{"BATCHSIZE": 2, "SEQLEN": 16}]) == 1 and quiet.take_measurements() == []

    class Flaky(CpuBackend):
        calls = 0

        def synchronize(self) -> None:
            self.calls += 1
            if self.calls == 3:  # the first timed replay's, after the probe's
                raise RuntimeError("device lost")

    r = runner(Flaky(), clock, replays=2)
    assert r.capture([{"BATCHSIZE": 2, "SEQLEN": 16}]) == 1 and r.ready() == [(2, 16)]
    assert r.take_measurements() == [] and r.meter.failures == 1
    x = torch.randn(2, 10, H)
    torch.testing.assert_close(r.run({"x": x}), torch.tanh(x))  # the graph serves requests


def test_a_meter_never_raises_and_static_bytes_counts_tensors_only() -> None:
    class Broken:
        def synchronize(self) -> None:
            raise RuntimeError("no device")

    meter = Meter(Broken(), FakeClock())
    assert meter.now() is None and meter.failures == 1
    assert meter.cost(object(), 0.0, 1.0, []) is None  # its replays cannot be timed
    assert meter.failures == 2  # the synchronize before the first replay, which never ran
    assert Meter(CpuBackend(), FakeClock()).cost(object(), 0.0, 1.0, []) is None  # no replay
    assert static_bytes([torch.zeros(3, 5), torch.zeros(10)[:4], "not a tensor"]) == 76


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_cuda_graph_is_measured_on_the_device() -> None:
    from gearshift.graphs.backends import cuda_backend

    weight = torch.randn(H, 1024, device="cuda")

    @torch.no_grad()
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x @ weight)[..., :H]

    transform = Transform(fn, DIMS, INPUTS, outputs=("B", "S", None))
    r = AdaptiveRunner(transform, {"x": torch.zeros(1, 1, H, device="cuda")},
                          pool=GraphResourcePool(cuda_backend(0)))
    assert r.capture([{"BATCHSIZE": 4, "SEQLEN": 16}, {"BATCHSIZE": 2, "SEQLEN": 16}]) == 2
    measured = r.take_measurements()
    assert len(measured) == 2 and r.meter.failures == 0
    for _, c in measured:
        assert 0 < c.replay_seconds < c.capture_seconds < 60
        assert c.graph_bytes > 0 and c.graph_bytes % (2 << 20) == 0  # its pool's segments
    r.release("SEQLEN", 16)

