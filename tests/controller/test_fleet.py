"""A controller in a fleet, in virtual time: what it publishes, what a late node takes, and the
store's faults (unreachable, slow) that leave it running alone."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fakeclock import FakeClock

from gearshift.controller import fleet as fleet_module
from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller
from gearshift.controller.costbook import CostBook
from gearshift.controller.fleet import Fleet
from gearshift.controller.fleetstore import Read, Store, redact
from gearshift.core.costs import Measurement
from gearshift.core.fleet import FleetKey
from gearshift.core.round import DeviceLedger

from .workers import DIMS, POLICY, WAIT, Worker

DIMS_B = DIMS["B"]

LADDER = (1, 2, 4, 8, 16, 32, 64)


def _synced(c: Controller, what: str = "reads", before: int | None = None) -> None:
    """Step `c` (real time passing) until its fleet counted one more `what`."""
    start = c.fleet.counts[what] if before is None else before
    deadline = time.monotonic() + WAIT
    while c.fleet.counts[what] <= start:
        assert time.monotonic() < deadline, f"no fleet {what}: {c.fleet.view(0)}"
        time.sleep(0.005)
        c.step()


def _open(namespace: str, tmp_path: Path, clock: FakeClock, store: Path,
          node: str) -> Controller:
    config = ControllerConfig(namespace=namespace, state_dir=str(tmp_path / namespace),
                              fleet_url=str(store), fleet_node=node, fleet_model="m",
                              fleet_publish_seconds=5.0)
    return Controller.open(config, POLICY, clock=clock)


def _learn(c: Controller, clock: FakeClock, w: Worker, seconds: float, value: int) -> None:
    for _ in range(round(seconds * 10)):
        clock.advance(0.1)
        w.put(0, value)
        c.step()


def test_a_late_node_starts_on_the_fleets_gears_and_its_first_round_keeps_them(
        namespace: str, tmp_path: Path) -> None:
    clock = FakeClock(time.monotonic())
    store = tmp_path / "fleet"
    early = _open(namespace, tmp_path, clock, store, "early")
    w = Worker(namespace, 0, clock)
    try:
        w.register(0, "decode", serve=early.step)
        _learn(early, clock, w, 15.0, 40)
        learned = early.devices[0].profiles["decode"].gear_lists()["B"]
        assert 40 in learned and learned != list(LADDER)
        measured = Measurement(40, 0.25, 1 << 20, 0.001)
        early.costs.add(0, "decode", "B", measured)
        for _ in range(2):  # the first may be a publish begun before the measurement
            clock.advance(early.config.fleet_publish_seconds)
            _synced(early, "publishes")
        assert early.fleet.state == "joined"
    finally:
        w.close()
    late_ns = namespace + "L"
    late = _open(late_ns, tmp_path, clock, store, "late")
    w2 = Worker(late_ns, 0, clock)
    try:
        assert late.fleet.counts["reads"] == 1 and late.fleet.state == "joined"
        w2.register(0, "decode", serve=late.step)
        assert list(w2.gears("decode")["B"]) == learned  # its first snapshot
        doc = late.status_document(clock.now())["fleet"]
        assert doc["state"] == "joined" and doc["nodes"] == 1
        assert doc["profiles"][0]["gears"]["B"] == {"early": learned}
        assert doc["profiles"][0]["disagreement"] == {"B": 0.0}
        prior = late.fleet.prior(0, late.devices[0], clock.now())
        assert prior is not None and prior["decode"]["B"][0].total_count >= POLICY.min_window_events
        assert late.costs.measurements(0, "decode")["B"] == [measured]  # its pricing's start
        clock.advance(2.0)
        late.step()  # its first round, on the prior: the fleet's gears stay
        assert list(late.devices[0].profiles["decode"].gear_lists()["B"]) == learned
    finally:
        w2.close()
        late.close()
        early.close()


def test_nodes_of_another_key_do_not_merge(namespace: str, tmp_path: Path) -> None:
    clock = FakeClock(time.monotonic())
    store = tmp_path / "fleet"
    early = _open(namespace, tmp_path, clock, store, "early")
    w = Worker(namespace, 0, clock)
    try:
        w.register(0, "decode", serve=early.step)
        _learn(early, clock, w, 15.0, 40)
    finally:
        w.close()
        early.close()  # publishes at stop
    other_ns = namespace + "O"
    config = ControllerConfig(namespace=other_ns, state_dir=str(tmp_path / other_ns),
                              fleet_url=str(store), fleet_node="other", fleet_model="m2")
    other = Controller.open(config, POLICY, clock=clock)
    w2 = Worker(other_ns, 0, clock)
    try:
        assert other.fleet.counts["reads"] == 1 and other.fleet.learned.members
        w2.register(0, "decode", serve=other.step)
        assert w2.gears("decode")["B"] == LADDER
        assert other.fleet.prior(0, other.devices[0], clock.now()) is None
    finally:
        w2.close()
        other.close()


class _Faulty:
    """A store that raises, or blocks until released."""

    url = "faulty://x"

    def __init__(self, error: Exception | None = None) -> None:
        self.error, self.release, self.calls = error, threading.Event(), 0

    def scrub(self, text: str) -> str:
        return text

    def publish(self, node: str, blob: bytes, published: float) -> str:
        self.read(published, 0.0)
        return ""

    def read(self, wall: float, ttl: float, skip: str | None = None) -> Read:
        self.calls += 1
        if self.error is not None:
            raise self.error
        assert self.release.wait(WAIT)
        return Read()


def _fleet(store: Any, clock: FakeClock, devices: dict | None = None) -> Fleet:
    return Fleet(store, "me", FleetKey(), POLICY, clock, clock, interval=60.0, ttl=600.0,
                 timeout=5.0).attach(devices or {}, CostBook())


def _settle(f: Fleet) -> None:
    if f._job is not None:
        f._job.join(WAIT)


def test_an_unreachable_store_leaves_the_node_alone_and_retries_with_backoff(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = FakeClock(1000.0)
    store = _Faulty(OSError("connection refused"))
    f = _fleet(store, clock)
    with caplog.at_level(logging.WARNING):
        f.first_read()
    assert f.state == "alone" and "connection refused" in f.reason
    assert f.view(clock.now())["state"] == "alone" and f.counts["failures"] == 1
    assert "running alone" in caplog.text
    waits = []
    for _ in range(4):
        t0, calls = clock.now(), store.calls
        while store.calls == calls:
            clock.advance(1.0)
            f.tick(clock.now())
            _settle(f)
        f.tick(clock.now())
        waits.append(clock.now() - t0)
    assert waits[1] > waits[0] * 1.5 and waits[2] > waits[1] * 1.5  # backoff doubles
    store.error = None
    store.release.set()
    clock.advance(60.0 * fleet_module.BACKOFF)
    f.tick(clock.now())
    _settle(f)
    f.tick(clock.now())
    assert f.state == "joined" and f.reason == ""


def test_a_slow_store_never_blocks_the_loop_and_the_node_runs_alone() -> None:
    clock = FakeClock(1000.0)
    store = _Faulty()
    f = _fleet(store, clock)
    f.timeout = 0.05
    f.first_read()  # waits at most `timeout` for the first read
    assert f.state == "alone" and "no answer" in f.reason
    ticked = threading.Thread(target=lambda: [f.tick(clock.now()) for _ in range(100)])
    ticked.start()
    ticked.join(WAIT / 2)
    assert not ticked.is_alive()  # the loop went on while the store hung
    store.release.set()
    _settle(f)
    f.tick(clock.now())
    assert f.state == "joined"


def test_a_store_that_hangs_after_joining_is_reported_slow() -> None:
    clock = FakeClock(1000.0)
    store = _Faulty()
    store.release.set()
    f = _fleet(store, clock)
    f.first_read()
    assert f.state == "joined"
    store.release.clear()
    clock.advance(61.0)
    f.tick(clock.now())  # a sync starts, and hangs
    clock.advance(6.0)
    f.tick(clock.now())
    assert f.state == "alone" and "no answer in 5 s" in f.reason
    store.release.set()
    _settle(f)


def test_credentials_never_reach_the_log_or_the_status(caplog: pytest.LogCaptureFixture,
                                                       tmp_path: Path) -> None:
    assert "hunter2" not in Store(f"file://{tmp_path}/f?secret_token=hunter2").url
    clock = FakeClock(1000.0)
    store = _Faulty(OSError("denied"))
    store.url = redact("s3://AKIA:hunter2@bucket/p?X-Amz-Security-Token=hunter2")
    f = _fleet(store, clock)
    with caplog.at_level(logging.WARNING):
        f.first_read()
    assert "s3://bucket/p" in caplog.text and "hunter2" not in caplog.text
    assert "hunter2" not in str(f.view(clock.now()))
    from gearshift.controller.view import _fleet as line

    shown = line(f.view(clock.now()))
    assert "fleet s3://bucket/p as me: ALONE (OSError: denied)" in shown and "hunter2" not in shown


def test_the_status_omits_the_fleet_when_off(controller: Controller, clock: FakeClock) -> None:
    assert controller.fleet.state == "off" and "fleet" not in controller.status_document(
        clock.now())
    assert controller.fleet.prior(0, DeviceLedger(), clock.now()) is None


def test_the_fleet_keys_are_checked_and_read_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gearshift.controller.config import load_configs
    from gearshift.errors import ConfigError

    monkeypatch.setenv("GEARSHIFT_FLEET_URL", "/mnt/fleet")
    _, config = load_configs(None, ["fleet_model=llama", "fleet_tp_size=2"])
    assert config.fleet_url == "/mnt/fleet" and config.fleet_key == FleetKey("llama", tp_size=2)
    assert config.fleet_node_name.endswith(".default")
    with pytest.raises(ConfigError, match="fleet_ttl_seconds"):
        ControllerConfig(fleet_ttl_seconds=60.0, fleet_publish_seconds=60.0)
    with pytest.raises(ConfigError, match="fleet_node"):
        ControllerConfig(fleet_node="a/b")
    with pytest.raises(ConfigError, match="fleet_tp_size"):
        ControllerConfig(fleet_tp_size=0)


def test_the_fleets_view_is_exported_as_metrics() -> None:
    pytest.importorskip("prometheus_client")
    from gearshift.controller.metrics import _Collector

    clock = FakeClock(1000.0)
    store = _Faulty(OSError("denied"))
    f = _fleet(store, clock)
    f.first_read()
    view = f.view(clock.now())
    view["profiles"] = [{"profile": "decode", "disagreement": {"B": 0.25}}]
    doc = {"workers": [], "events": {"unknown": 0, "invalid": 0, "reclaimed_workers": 0},
           "rounds": {"count": 0, "seconds_sum": 0.0}, "devices": [], "fleet": view}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in _Collector(lambda: doc).collect() for s in family.samples}
    assert samples[("gearshift_fleet_joined", (("state", "alone"),))] == 0.0
    assert samples[("gearshift_fleet_operations_total", (("outcome", "failures"),))] == 1
    assert samples[("gearshift_fleet_disagreement", (("dim", "B"), ("profile", "decode")))] == 0.25


def test_a_node_alone_forgets_what_it_read_once_that_expires() -> None:
    from gearshift.controller.fleet import _Learned
    from gearshift.controller.fleetcodec import Generation

    clock = FakeClock(1000.0)
    store = _Faulty(OSError("gone"))
    f = _fleet(store, clock)
    f.first_read()
    f.learned = _Learned({"id": []}, {}, Read([Generation("x", 990.0, ())]), 1000.0)
    clock.advance(500.0)
    f.tick(clock.now())
    assert f.learned.members  # within the TTL: kept while alone
    clock.advance(200.0)
    f.tick(clock.now())
    assert not f.learned.members and not f.learned.read.generations


def test_an_errors_message_is_scrubbed_of_the_urls_secrets(tmp_path: Path) -> None:
    store = Store(f"file://{tmp_path}/f?sig=hunter2")
    assert store.scrub("GET file://x?sig=hunter2 failed: hunter2") == "GET file://x?*** failed: ***"
    clock = FakeClock(1000.0)
    faulty = _Faulty(OSError("denied for sig=hunter2"))
    faulty.scrub = store.scrub  # type: ignore[attr-defined]
    f = _fleet(faulty, clock)
    f.first_read()
    assert "hunter2" not in f.reason and "***" in f.reason


class _Recording:
    """A store that answers at once and counts what it is asked."""

    url = "rec://x"

    def __init__(self) -> None:
        self.published: list[float] = []
        self.reads = 0

    def scrub(self, text: str) -> str:
        return text

    def publish(self, node: str, blob: bytes, published: float) -> str:
        self.published.append(published)
        return ""

    def read(self, wall: float, ttl: float, skip: str | None = None) -> Read:
        self.reads += 1
        return Read()


def test_publishes_are_bounded_to_one_an_interval_and_one_at_stop() -> None:
    from gearshift.core.round import ProfileLedger

    clock = FakeClock(1000.0)
    store = _Recording()
    devices = {0: DeviceLedger(profiles={"p": ProfileLedger.new({"B": DIMS_B}, 1000.0, POLICY)})}
    f = _fleet(store, clock, devices)
    f.first_read()
    assert store.reads == 1 and store.published == []  # the first read publishes nothing
    for _ in range(1300):  # 130 s of 0.1 s loop iterations
        clock.advance(0.1)
        f.tick(clock.now())
        _settle(f)
    assert len(store.published) == 2 and store.published[1] - store.published[0] >= 60.0
    f.close(clock.now())
    assert len(store.published) == 3 and store.published[-1] == clock.now()


def test_a_publish_that_fails_still_reads_the_others() -> None:
    class _NoPublish(_Recording):
        def publish(self, node: str, blob: bytes, published: float) -> str:
            raise OSError("read-only bucket")

    from gearshift.core.round import ProfileLedger

    clock = FakeClock(1000.0)
    store = _NoPublish()
    devices = {0: DeviceLedger(profiles={"p": ProfileLedger.new({"B": DIMS_B}, 1000.0, POLICY)})}
    f = _fleet(store, clock, devices)
    f.first_read()
    clock.advance(61.0)
    f.tick(clock.now())
    _settle(f)
    f.tick(clock.now())
    assert store.reads == 2 and f.counts["reads"] == 2
    assert f.state == "alone" and "read-only bucket" in f.reason
