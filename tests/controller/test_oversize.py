"""Snapshots and status documents larger than their regions: refused alone, not applied, or
published shrunk; never a device broken for good or a restart that fails on its own state."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator

import pytest
from fakeclock import FakeClock

from gearshift.controller import statefile, status
from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller
from gearshift.core.dims import Dim
from gearshift.core.round import DeviceLedger, ProfileLedger
from gearshift.errors import PayloadError
from gearshift.protocol import snapshot_payload
from gearshift.shm import SnapshotRegion, codec, names

from .workers import DIMS, POLICY, Worker

BIG = {"B": Dim(gears=range(1, 2401), max=8192)}  # ~7.2 KB of gears: one registration's most
SMALL = 16 << 10  # bytes of the tests' device regions (1 MiB by default)


def _sized(capacity: int) -> type[Controller]:
    class Region(SnapshotRegion):
        @classmethod
        def open(cls, namespace: str, device: int) -> SnapshotRegion:
            return cls.open_named(names.snapshot(namespace, device), capacity)

    class Small(Controller):
        region_type = Region

    return Small


@pytest.fixture
def opened(config: ControllerConfig, clock: FakeClock) -> Iterator[Callable[..., Controller]]:
    made: list[Controller] = []

    def open_(capacity: int = SMALL) -> Controller:
        made.append(_sized(capacity).open(config, POLICY, clock=clock))
        return made[-1]

    yield open_
    for c in made:
        c.close()


def test_a_profile_over_the_snapshot_region_is_refused_alone(
    opened: Callable[..., Controller], clock: FakeClock
) -> None:
    controller = opened()
    w = Worker(controller.config.namespace, 0, clock)
    try:
        w.register(0, "big0", BIG, serve=controller.step)
        w.register(1, "big1", BIG, serve=controller.step)
        with pytest.raises(PayloadError, match=r"profile 'big2' not registered on device 0: .*"
                                               rf"exceeds the region's capacity of {SMALL} bytes"):
            w.register(2, "big2", BIG, serve=controller.step)
        w.register(3, "other", serve=controller.step)  # before: refused too, for good
        snap = w.snapshot()
        assert snap is not None and set(snap[1]["profiles"]) == {"big0", "big1", "other"}
    finally:
        w.close()
    controller.close()
    again = opened()  # before: PayloadError, on every start
    assert set(again.devices[0].profiles) == {"big0", "big1", "other"}


def test_a_restored_device_over_its_region_is_said_and_the_controller_runs(
    opened: Callable[..., Controller], config: ControllerConfig, clock: FakeClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    profiles = {f"big{i}": ProfileLedger.new(BIG, clock.now(), POLICY) for i in range(3)}
    statefile.save(config.state_path, {0: DeviceLedger(version=3, profiles=profiles)})
    with caplog.at_level(logging.ERROR):
        controller = opened()  # before: PayloadError, serve exits 1 on every start
    assert "publish of device 0 failed" in caplog.text
    controller.step()
    assert set(controller.devices[0].profiles) == set(profiles)  # kept, nothing lost


def test_a_round_whose_gears_would_not_fit_is_not_applied(
    opened: Callable[..., Controller], clock: FakeClock
) -> None:
    dims = {"B": Dim(gears=DIMS["B"].initial_gears, max=1000)}
    gears = {"B": list(DIMS["B"].initial_gears)}  # one byte each
    name = next(n for n in ("p" * k for k in range(1, 128))  # a snapshot of exactly 128 bytes
                if len(codec.pack(snapshot_payload(0, {n: gears}))) == 128)
    controller = opened(128)
    w = Worker(controller.config.namespace, 0, clock)
    try:
        w.register(0, name, dims, serve=controller.step)
        for _ in range(150):  # traffic at 1000 makes the policy add a gear of 3 bytes
            clock.advance(0.1)
            for value in (*gears["B"], 1000, 1000, 1000):  # (and at every gear: none evicted)
                w.put(0, value)
            controller.step()
        assert controller.devices[0].profiles[name].gear_lists() == gears  # before: [..., 1000]
        assert controller.errors > 0
    finally:
        w.close()
    controller.close()
    assert opened(128).devices[0].profiles[name].gear_lists() == gears  # before: PayloadError


def test_a_status_document_over_its_region_is_published_shrunk_and_marked(
    config: ControllerConfig, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(status, "CAPACITY", 4096)
    controller = Controller.open(config, POLICY, clock=clock)
    w = Worker(config.namespace, 0, clock)
    try:
        w.register(0, "wide", {"B": Dim(gears=range(1, 301), max=8192)}, serve=controller.step)
        clock.advance(5.0)
        controller.step()  # before: the status phase fails, the document stays stale
        doc = status.read(config.namespace)
        assert doc is not None and doc["time"] == clock.now()
        assert doc["truncated"].startswith("per-gear statistics left out")
        (dim,) = doc["devices"][0]["profiles"][0]["dims"]
        assert dim["gears"] == list(range(1, 301)) and dim["hit_rate"] == []
        assert doc["workers"][0]["profiles"] == [[0, "wide"]]  # kept whole: a successor maps them
    finally:
        w.close()
        controller.close()
