"""The client's session: connect, registration, heartbeats and memory readings, the ring, and
what happens without a controller (a fake one stands in; a controller killed, restarted,
embedded or real: test_session_controller.py)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from fakeclock import FakeClock

import gearshift as gs
from gearshift.shm import EventRing, Kind, Registry, SlotState, Snapshot, cleanup, names, segment
from gearshift.shm.segment import exists
from gearshift.worker import Client
from worker.fake_controller import WAIT, FakeController, ServingClock, serve, wait_until
from worker.procs import DECODE


def test_the_api_example_works_as_written(namespace: str, mp, spawn) -> None:
    ready, stop, registered = mp.Event(), mp.Event(), mp.Queue()  # kept: the child opens them
    child = spawn(serve, namespace, True, {}, ready, registered, stop)
    assert ready.wait(WAIT)
    ns = namespace
    try:
        client = gs.connect(namespace=ns, device=0)
        prof = client.profile(
            "decode",
            {
                "BATCHSIZE": gs.Dim(gears=[1, 2, 4, 8, 16, 32, 64], splittable=True),
                "SEQLEN": gs.Dim(min=1, max=8192, align=16),
            },
        )
        route = prof.route(BATCHSIZE=13, SEQLEN=700)
        assert route.gears == {"BATCHSIZE": 16, "SEQLEN": 1024}
        assert prof.route(BATCHSIZE=130, SEQLEN=700).chunks == {
            "BATCHSIZE": (64, 64, 2),
            "SEQLEN": (1024,),
        }
        assert prof.gears["SEQLEN"] == tuple(1 << k for k in range(14))
        wait_until(lambda: prof.version == 1)  # published on registration (2 s, or the thread)
        assert prof.registered
        client.close()
    finally:
        stop.set()
        child.join(WAIT)
        cleanup(namespace)


def test_the_routing_client_never_imports_torch() -> None:
    code = (
        "import sys, gearshift as gs, gearshift.worker as gw, gearshift.tools.bench.hotpath\n"
        "assert gs.connect and gw.Client and gw.Profile and gw.Route and gw.GroupRank\n"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=WAIT)


def test_require_controller_refuses_without_a_live_one_and_says_how_to_start_it(
    namespace: str,
) -> None:
    hint = f"gearshift serve -n {namespace}"
    with pytest.raises(gs.ControllerNotFound, match=hint):
        gs.connect(namespace=namespace, require_controller=True)
    registry = Registry.create(namespace)  # a namespace whose controller is gone
    try:
        with pytest.raises(gs.ControllerNotFound, match=hint):
            gs.connect(namespace=namespace, require_controller=True)
        assert all(info.state == SlotState.FREE for info in registry.slots())
    finally:
        registry.unlink()
        registry.close()


def test_without_a_controller_a_client_serves_its_initial_gears_and_warns_rate_limited(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "gearshift")
    clock = FakeClock()
    with gs.connect(namespace, clock=clock, background=False) as client:
        prof = client.profile("decode", DECODE)  # no controller to wait for
        assert clock.now() == 0 and client.registry is None and client.slot is None
        for _ in range(150):  # 150 s of virtual time: warnings at 0, 60 and 120 s
            assert prof.route(BATCHSIZE=3, SEQLEN=700).gears == {"BATCHSIZE": 4, "SEQLEN": 1024}
            client._tick()
            clock.advance(1.0)
        assert client.unrecorded == 150 and prof.version == 0 and not prof.registered
        warnings = [r.getMessage() for r in caplog.records if "no controller" in r.getMessage()]
        assert len(warnings) == 3 and f"gearshift serve -n {namespace}" in warnings[0]
    assert not [n for n in os.listdir("/dev/shm") if namespace in n]


def test_a_client_attaches_when_its_controller_appears_and_records_from_then_on(
    namespace: str,
) -> None:
    client = gs.connect(namespace, background=False, register_timeout=0)
    fake = None
    try:
        prof = client.profile("decode", DECODE)
        prof.route(BATCHSIZE=1, SEQLEN=1)  # unrecorded
        client._tick()
        assert client.slot is None
        fake = FakeController(namespace)
        client._tick()  # attaches: a slot, its ring, the registration posted
        assert client.slot is not None and client.unrecorded == 1
        wait_until(lambda: prof.registered, lambda: (fake.serve(), client._tick()))
        assert fake.registered == [(client.slot, prof.id, "decode")]
        later = client.profile("prefill", {"SEQLEN": gs.Dim(max=4096)})
        prof.route(BATCHSIZE=2, SEQLEN=2)  # into the ring, as a profile made now
        later.route(SEQLEN=3)
        events = fake.drain(client.slot)
        assert [(e["profile"], e["values"][0]) for e in events] == [(prof.id, 2), (later.id, 3)]
        version = fake.publish({"decode": {"BATCHSIZE": [4, 64], "SEQLEN": [8192]}})
        client._tick()
        assert prof.version == version and prof.gears["BATCHSIZE"] == (4, 64)
    finally:
        client.close()
        if fake is not None:
            fake.close()


def test_a_client_of_a_dead_controllers_namespace_takes_a_slot_and_does_not_wait(
    namespace: str,
) -> None:
    registry = Registry.create(namespace)  # its controller is gone
    clock = FakeClock()
    try:
        with gs.connect(namespace, clock=clock, background=False) as client:
            assert registry.slots()[client.slot].state == SlotState.ACTIVE
            prof = client.profile("decode", DECODE)
            assert clock.now() == 0 and not prof.registered
            prof.route(BATCHSIZE=1, SEQLEN=1)
            fake = FakeController(namespace, create=False)  # takes the namespace over
            wait_until(lambda: prof.registered, lambda: (fake.serve(), client._tick()))
            assert len(fake.drain(client.slot)) == 1 and client.unrecorded == 0
        fake.close()
    finally:
        registry.close()


def test_registration_round_trip(fake: FakeController, client: Client) -> None:
    prof = client.profile("decode", DECODE)
    other = client.profile("prefill", {"SEQLEN": gs.Dim(max=4096)})
    assert prof.registered and other.registered and (prof.id, other.id) == (0, 1)
    assert fake.registered == [(client.slot, 0, "decode"), (client.slot, 1, "prefill")]
    assert fake.known["decode"] == DECODE


def test_profile_mismatch_reaches_the_caller(fake: FakeController, client: Client) -> None:
    fake.known["decode"] = {"BATCHSIZE": gs.Dim(max=16)}  # another worker registered it so
    with pytest.raises(gs.ProfileMismatch, match="other dims"):
        client.profile("decode", DECODE)
    prof = client.profile("prefill", {"SEQLEN": gs.Dim()})  # the mailbox still works
    assert prof.registered and fake.registered == [(client.slot, prof.id, "prefill")]


def test_unanswered_registration_serves_initial_gears_then_completes_on_a_tick(
    fake: FakeController, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()  # time passes, nobody answers
    with Client(Registry.attach(fake.namespace), 0, clock=clock, background=False) as client:
        prof = client.profile("decode", DECODE)
        assert clock.now() >= client.register_timeout and "no registration reply" in caplog.text
        assert not prof.registered and prof.route(BATCHSIZE=3, SEQLEN=3).gears["BATCHSIZE"] == 4
        assert client._tick()  # busy: a registration is unanswered
        fake.serve()
        client._tick()
        assert prof.registered and fake.registered == [(client.slot, prof.id, "decode")]
        assert not client._tick()  # registered, no runner to warm up: idle


def test_ticks_ack_the_applied_version_beat_and_report_memory(
    fake: FakeController, namespace: str
) -> None:
    clock = FakeClock()
    registry = Registry.attach(namespace)
    with Client(registry, 0, clock=clock, memory=lambda: (3, 7), background=False) as client:
        version = fake.publish({"decode": {"BATCHSIZE": [4, 64], "SEQLEN": [8192]}})
        client._tick()
        info = fake.registry.slots()[client.slot]
        assert (info.applied_version, info.heartbeat_ns) == (version, clock.now_ns())
        assert [tuple(e["values"][:2]) for e in fake.drain(client.slot)] == [(3, 7)]
        clock.advance(0.5)
        client._tick()  # nothing is due
        assert len(fake.drain(client.slot)) == 0
        assert fake.registry.slots()[client.slot].heartbeat_ns < clock.now_ns()
        clock.advance(0.5)
        client._tick()
        (reading,) = fake.drain(client.slot)
        assert reading["kind"] == Kind.MEMORY and reading["t_ns"] == clock.now_ns()
        assert fake.registry.slots()[client.slot].heartbeat_ns == clock.now_ns()


def test_a_new_version_is_acked_at_once_not_at_the_next_heartbeat(
    fake: FakeController, namespace: str
) -> None:
    clock = FakeClock()
    with Client(Registry.attach(namespace), 0, clock=clock, background=False) as client:
        fake.publish({"decode": {"BATCHSIZE": [4, 64], "SEQLEN": [8192]}})
        client._tick()
        clock.advance(client.heartbeat_interval / 4)  # no heartbeat due
        version = fake.publish({"decode": {"BATCHSIZE": [8, 64], "SEQLEN": [8192]}})
        client._tick()
        info = fake.registry.slots()[client.slot]
        assert (info.applied_version, info.heartbeat_ns) == (version, clock.now_ns())


class _Runner:
    """The smallest Runner: captures whatever it is asked to, at once."""

    transform = None

    def __init__(self, dims: dict[str, gs.Dim]) -> None:
        self.gears = {d: s.initial_gears for d, s in dims.items()}
        self.captured: set[tuple[int, ...]] = set()

    def ready(self) -> list[tuple[int, ...]]:
        return sorted(self.captured)

    def capture(self, variants: list[dict[str, int]]) -> int:
        new = {tuple(v[d] for d in self.gears) for v in variants} - self.captured
        self.captured |= new
        return len(new)

    def release(self, dim: str, gear: int) -> int:
        i = list(self.gears).index(dim)
        gone = {v for v in self.captured if v[i] == gear}
        self.captured -= gone
        return len(gone)

    def room(self) -> tuple[None, str]:
        return None, ""

    def run(self, tensors: object, sizes: object = None) -> None:
        return None


def test_a_version_is_acked_only_once_every_profile_has_warmed_it_up(
    fake: FakeController, client: Client
) -> None:
    dims = {"BATCHSIZE": gs.Dim(gears=[1, 2], max=64), "SEQLEN": gs.Dim(gears=[8], max=64)}
    prof = client.profile("p", dims, lazy_start=False)
    prof.attach(_Runner(dims))
    for _ in range(5):
        client._tick()
    assert prof.settled
    version = fake.publish({"p": {"BATCHSIZE": [*range(1, 11)], "SEQLEN": [*range(1, 11)]}})
    client._tick()  # adopted: 100 variants to capture, a few a tick
    assert prof.version == version and not prof.settled
    assert fake.registry.slots()[client.slot].applied_version != version
    for _ in range(100):
        client._tick()
    assert prof.settled and fake.registry.slots()[client.slot].applied_version == version


def test_a_full_ring_drops_and_counts_events_and_routing_goes_on(fake: FakeController) -> None:
    registry = Registry.attach(fake.namespace)
    with Client(registry, 0, background=False, register_timeout=0, ring_capacity=4) as client:
        prof = client.profile("decode", DECODE)
        routes = [prof.route(BATCHSIZE=b, SEQLEN=9) for b in range(1, 7)]
        assert [p.gears["BATCHSIZE"] for p in routes] == [1, 2, 4, 4, 8, 8]
        client._tick()
        assert fake.registry.slots()[client.slot].dropped == 2
        assert [e["values"][0] for e in fake.drain(client.slot)] == [1, 2, 3, 4]


class _BadRegion:
    """A snapshot region whose every read fails as `error` does (a decoder's bug, say)."""

    def __init__(self, version: int, error: BaseException) -> None:
        self._version, self.error = version, error

    def version(self) -> int:
        return self._version

    def read(self) -> None:
        raise self.error


@pytest.mark.parametrize(
    "error", [gs.PayloadError("corrupt"), KeyError("gears"), RecursionError(), MemoryError()]
)
def test_a_snapshot_that_fails_to_decode_is_kept_out_and_routing_goes_on(
    fake: FakeController,
    client: Client,
    error: BaseException,
    caplog: pytest.LogCaptureFixture,
) -> None:
    prof = client.profile("decode", DECODE)
    good = fake.publish({"decode": {"BATCHSIZE": [4, 64], "SEQLEN": [8192]}})
    assert prof.route(BATCHSIZE=3, SEQLEN=3).version == good
    region = client.region
    client.region = _BadRegion(good + 1, error)  # type: ignore[assignment]
    for _ in range(3):  # one warning, and no retry on every request
        assert prof.route(BATCHSIZE=3, SEQLEN=3).gears == {"BATCHSIZE": 4, "SEQLEN": 8192}
    assert client._seen == good + 1 and prof.version == good
    assert sum("kept out" in r.getMessage() for r in caplog.records) == 1
    client.region = region
    assert fake.publish({"decode": {"BATCHSIZE": [2, 64], "SEQLEN": [8192]}}) == good + 1
    newer = fake.publish({"decode": {"BATCHSIZE": [8, 64], "SEQLEN": [8192]}})  # the next
    assert prof.route(BATCHSIZE=3, SEQLEN=3).gears == {"BATCHSIZE": 8, "SEQLEN": 8192}
    assert prof.version == newer


def test_a_payload_a_profile_cannot_adopt_is_kept_out_of_it(
    fake: FakeController, client: Client
) -> None:
    class Hostile(dict):
        def __getitem__(self, key: object) -> object:
            raise RuntimeError("hostile payload")

    prof = client.profile("decode", DECODE)
    gears = prof.gears
    version = fake.region.publish({"profiles": {}})
    client.region.read = lambda: Snapshot(version, Hostile())  # type: ignore[union-attr]
    assert prof.route(BATCHSIZE=3, SEQLEN=3).gears["BATCHSIZE"] == 4
    assert prof.gears == gears and client._seen == version


def test_close_releases_the_slot_and_leaves_the_ring_to_the_controller(
    fake: FakeController, client: Client
) -> None:
    prof = client.profile("decode", DECODE)
    prof.route(BATCHSIZE=1, SEQLEN=1)
    client.close()
    client.close()
    assert fake.registry.slots()[client.slot].state == SlotState.RELEASED
    assert exists(names.ring(fake.namespace, client.slot))
    assert len(fake.drain(client.slot)) == 1
    assert prof.route(BATCHSIZE=2, SEQLEN=2).gears == {"BATCHSIZE": 2, "SEQLEN": 2}  # unrecorded


def test_the_swap_thread_adopts_snapshots_without_requests(fake: FakeController) -> None:
    registry = Registry.attach(fake.namespace)
    with Client(registry, 0, register_timeout=0) as client:
        prof = client.profile("decode", DECODE)
        wait_until(lambda: prof.registered, fake.serve)
        version = fake.publish({"decode": {"BATCHSIZE": [8, 64], "SEQLEN": [4096, 8192]}})
        wait_until(lambda: prof.version == version)
        assert prof.gears == {"BATCHSIZE": (8, 64), "SEQLEN": (4096, 8192)}
        wait_until(lambda: fake.registry.slots()[client.slot].applied_version == version)


@pytest.mark.parametrize("error", ["no room", "other"])
def test_a_worker_whose_ring_cannot_be_created_leaves_no_active_slot(
    fake: FakeController, monkeypatch: pytest.MonkeyPatch, error: str
) -> None:
    tries = []

    def fail(namespace: str, slot: int, capacity: int) -> EventRing:
        tries.append(slot)
        if error == "no room":  # what a full /dev/shm raises (test_space.py)
            raise segment.no_space(names.ring(namespace, slot), 4194560)
        raise OSError("ring creation failed")

    monkeypatch.setattr(EventRing, "create", staticmethod(fail))
    clock = ServingClock(fake.serve)
    if error == "other":  # the constructor raises it
        with pytest.raises(OSError, match="ring creation failed"):
            Client(fake.namespace, 0, clock=clock, background=False)
    else:  # serves unrecorded and tries again later
        client = Client(fake.namespace, 0, clock=clock, background=False)
        try:
            for _ in range(3):  # the first try and two retries, none between
                client._tick()
                clock.advance(client.retry_interval / 2)
                client._tick()
                clock.advance(client.retry_interval / 2)
            assert client.slot is None and len(tries) == 3
        finally:
            client.close()
    assert [s.slot for s in fake.registry.slots() if s.state == SlotState.ACTIVE] == []
