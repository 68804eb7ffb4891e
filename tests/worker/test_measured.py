"""A profile's measured graphs go to the controller as MEASURED ring records from the swap
thread, one per dim of each graph, only once the profile is registered; nothing about it
raises into a request or stops a capture."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from fakeclock import FakeClock

import gearshift as gs
from gearshift.graphs import AdaptiveRunner, Transform
from gearshift.graphs.measure import GraphCost
from gearshift.shm import Kind, Registry, ring
from gearshift.worker import Client
from gearshift.worker import measured as measured_module
from gearshift.worker.measured import Measured
from worker.fake_controller import FakeController

DIMS = {"BATCHSIZE": gs.Dim(gears=[2, 4], max=64), "SEQLEN": gs.Dim(gears=[16, 32], max=64)}


class MeasuringRunner:
    """The Runner protocol; each capture is "measured" at (capture 0.1 s, bytes = the product
    of its gears, replay = that many microseconds); `broken` makes take_measurements raise."""

    def __init__(self, dims: Mapping[str, gs.Dim]) -> None:
        self.gears = {d: s.initial_gears for d, s in dims.items()}
        self.transform: Any = None
        self.captured: list[dict[str, int]] = []
        self.costs: list[tuple[dict[str, int], GraphCost]] = []
        self.broken = False

    def ready(self) -> list[tuple[int, ...]]:
        return sorted(tuple(v.values()) for v in self.captured)

    def capture(self, variants: Iterable[Mapping[str, int]]) -> int:
        for v in variants:
            size = v["BATCHSIZE"] * v["SEQLEN"]
            self.captured.append(dict(v))
            self.costs.append((dict(v), GraphCost(0.1, size, size * 1e-6)))
        return 1

    def take_measurements(self) -> list[tuple[dict[str, int], GraphCost]]:
        if self.broken:
            raise RuntimeError("broken meter")
        out, self.costs = self.costs, []
        return out

    def release(self, dim: str, gear: int) -> int:
        return 0

    def room(self) -> tuple[int | None, str]:
        return None, ""

    def run(self, tensors: Mapping[str, Any], sizes: Mapping[str, int] | None = None) -> Any:
        return None


def test_reports_wait_for_the_registration_then_go_one_record_per_dim(
    fake: FakeController,
) -> None:
    client = Client(Registry.attach(fake.namespace), 0, clock=FakeClock(),
                       background=False, register_timeout=0)
    try:
        # posted; the fake controller has not answered
        prof = client.profile("decode", DIMS, lazy_start=False)
        runner = prof.attach(MeasuringRunner(DIMS))
        client._tick()
        assert len(runner.captured) == 4 and not prof.registered
        assert Kind.MEASURED not in fake.drain(client.slot)["kind"]  # held back
        fake.serve()
        client._tick()  # takes the reply, then reports
        assert prof.registered
        records = fake.drain(client.slot)
        records = records[records["kind"] == Kind.MEASURED]
        assert len(records) == 8  # two dims per graph
        assert set(records["profile"]) == {prof.id} and set(records["ndim"]) == {4}
        got = sorted((int(r["chunks"][0]), *r["values"].tolist()) for r in records)
        want = sorted((i, v[d], 100_000_000, v["BATCHSIZE"] * v["SEQLEN"],
                       v["BATCHSIZE"] * v["SEQLEN"] * 1000)
                      for v in runner.captured for i, d in enumerate(DIMS))
        assert got == want
    finally:
        client.close()


def test_a_failing_report_stops_neither_the_warm_up_nor_requests(
    fake: FakeController, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    prof = client.profile("decode", DIMS, lazy_start=False)
    runner = prof.attach(MeasuringRunner(DIMS))
    runner.broken = True
    with caplog.at_level(logging.WARNING, "gearshift"):
        client._tick()
        client._tick()
    assert len(runner.captured) == 4 and prof.settled
    [failed] = caplog.records  # logged once, not at every tick
    assert "reporting measurements failed" in failed.getMessage()
    assert prof.route(BATCHSIZE=3, SEQLEN=20).gears == {"BATCHSIZE": 4, "SEQLEN": 32}


def test_pending_is_bounded_and_out_of_bounds_costs_and_full_rings_drop() -> None:
    measured = Measured(["B"])
    runner = MeasuringRunner({"B": gs.Dim(), "SEQLEN": gs.Dim()})
    runner.costs = [({"B": 8}, GraphCost(5000.0, 1, 1e-3)),  # over an hour: dropped
                    ({"SEQLEN": 8}, GraphCost(0.1, 1, 1e-3))]  # not this profile's dim
    measured.collect(runner)
    assert measured.dropped == 2 and not measured.pending
    runner.costs = [({"B": g}, GraphCost(0.1, 1, 1e-3))
                    for g in range(1, measured_module.MAX_PENDING + 6)]
    measured.collect(runner)
    assert len(measured.pending) == measured_module.MAX_PENDING and measured.dropped == 7
    assert measured.pending[0][1].gear == 6  # the oldest went
    writes: list[tuple[int, ...]] = []
    room = iter([True, True, False])
    assert measured.flush(lambda *a: writes.append(a) or next(room), 5, 3, 9) == 2
    assert measured.dropped == 8 and len(measured.pending) == measured_module.MAX_PENDING - 3
    assert writes[0][:2] == (5, 6)  # t_ns, the gear


class BufferedRunner(MeasuringRunner):
    """MeasuringRunner with static buffers: `footprint` per dim (gear, bytes, bytes on it)."""

    def __init__(self, dims: Mapping[str, gs.Dim]) -> None:
        super().__init__(dims)
        self.footprint: Any = {"B": (8, 96, 64)}

    def buffer_bytes(self) -> Any:
        return self.footprint


def test_the_buffers_go_when_they_change_and_again_every_resend_ns() -> None:
    measured, runner = Measured(["B"]), BufferedRunner({"B": gs.Dim()})
    writes: list[tuple[int, ...]] = []

    def write(*record: int) -> bool:
        writes.append(record)
        return True

    measured.collect(runner)
    assert measured.due(0) and measured.flush(write, 0, 3, 9) == 0  # no measurement, buffers
    assert writes == [(0, *ring.buffers(3, 9, 0, 8, 96, 64))]
    measured.collect(runner)
    assert not measured.due(measured_module.RESEND_NS - 1)  # unchanged: not yet again
    assert measured.due(measured_module.RESEND_NS)
    runner.footprint = {"B": (16, 160, 128)}  # grown: at once
    measured.collect(runner)
    assert measured.due(1)
    measured.flush(write, 1, 3, 9)
    assert writes[-1] == (1, *ring.buffers(3, 9, 0, 16, 160, 128))


@pytest.mark.parametrize("footprint", [
    {"B": (8, 96, 97)}, {"B": (0, 96, 64)}, {"B": (8, -1, 0)}, {"SEQLEN": (8, 96, 64)},
    {"B": (8, 96)}, {"B": ("x", 1, 1)},
])
def test_buffers_out_of_bounds_are_not_sent(footprint: Any) -> None:
    measured, runner = Measured(["B"]), BufferedRunner({"B": gs.Dim()})
    runner.footprint = footprint
    measured.collect(runner)
    assert measured.buffers is None and not measured.due(0)


def test_a_workers_buffers_reach_the_controllers_memory_bound(namespace: str, tmp_path) -> None:
    """A real runner's static buffers (x: SEQLEN x H floats, sized by the largest gear) go
    from the worker's ring to the controller's cost book, and the device's bound and held
    bytes count them once: the bound is 1.25 x the start-up graphs and buffers, at least
    0.5 % of the device's memory as the worker reads it."""
    import torch

    from gearshift.controller import PolicyConfig
    from gearshift.controller.config import ControllerConfig
    from gearshift.controller.controller import Controller
    from gearshift.core import memory
    from gearshift.core.costs import Line
    from gearshift.graphs.backends import CpuBackend
    from gearshift.graphs.pool import GraphResourcePool
    from worker.fake_controller import ServingClock

    h, dims = 4, {"SEQLEN": gs.Dim(gears=[8, 16], max=64)}
    config = ControllerConfig(namespace=namespace, state_dir=str(tmp_path))
    clock = ServingClock(lambda: None, start=1000.0)
    controller = Controller.open(config, PolicyConfig(), clock=clock)
    clock.serve = controller.step
    try:
        with Client(Registry.attach(namespace), 0, clock=clock, background=False) as client:
            prof = client.profile("p", dims, lazy_start=False)
            transform = Transform(torch.tanh, prof.dims, {"x": ("S", None)})
            prof.attach(AdaptiveRunner(transform, {"x": torch.zeros(1, h)},
                                          pool=GraphResourcePool(CpuBackend())))
            client._tick()  # captures 8 and 16, reports them and the buffers
            controller.step()
            assert controller.costs.buffers(0, "p") == {"SEQLEN": Line(0.0, 4.0 * h)}
            prices = controller.prices(0)
            held, bound, buffers = memory.usage(
                {"p": dims}, {"p": {"SEQLEN": [8, 16]}}, prices, controller.policy)
            graphs = prices["p"]["SEQLEN"].held_bytes([8, 16])
            assert buffers == 16 * h * 4 and held == graphs + buffers
            assert bound == pytest.approx(1.25 * (graphs + buffers))
            device = controller.device_memory(0)  # the host's RAM, the cpu's memory
            assert device is not None and device > 0
            doc = controller.status_document(clock.now())["devices"][0]["graph_bytes"]
            assert doc == {"held": held, "bound": max(bound, 0.005 * device), "buffers": buffers}
    finally:
        controller.close()
