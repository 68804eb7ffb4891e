"""The controller against broken and hostile participants: a bad slot, message, registration,
ring or profile fails alone, is refused in one short line, and never stalls the loop."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest
from fakeclock import FakeClock

from gearshift import protocol
from gearshift.clock import MonotonicClock
from gearshift.controller import registrations
from gearshift.controller.controller import Controller
from gearshift.core.dims import Dim
from gearshift.errors import NamespaceBusy, PayloadError, ShapeError, SpaceError
from gearshift.shm import (
    EventRing,
    Registry,
    SnapshotRegion,
    control,
    mailbox,
    names,
    ring,
    segment,
)
from gearshift.shm.segment import Segment

from .workers import WAIT, Worker


def _take_reply(w: Worker) -> dict:
    reply = w.registry.replies(w.slot).take()
    assert reply is not None, "no reply"
    return reply


def test_a_junk_request_gets_a_short_refusal_and_other_slots_are_served(
    controller: Controller, worker: Callable[..., Worker]
) -> None:
    junk, good = worker(), worker()
    box = junk.registry.requests(junk.slot)
    assert box.post({"op": "register", "profile": "x" * 6000, "name": "y" * 1000, "dims": []})
    assert good.registry.requests(good.slot).post(
        protocol.register_message(0, "decode", {"B": Dim(max=64)}))
    controller.step()  # one iteration answers both
    refusal = _take_reply(junk)
    assert refusal["error"] == "PayloadError" and len(refusal["message"]) < 300
    assert _take_reply(good)["op"] == "registered"


def test_a_reply_that_cannot_be_posted_fails_its_slot_alone(
    controller: Controller, worker: Callable[..., Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    broken, good = worker(), worker()
    for w in (broken, good):
        assert w.registry.requests(w.slot).post(
            protocol.register_message(0, f"p{w.slot}", {"B": Dim(max=64)}))
    post = mailbox.Mailbox.post

    def post_or_fail(box: mailbox.Mailbox, message: dict) -> bool:
        if box is controller.registry.replies(broken.slot):
            raise PayloadError("this reply does not fit")
        return post(box, message)

    monkeypatch.setattr(mailbox.Mailbox, "post", post_or_fail)
    errors = controller.errors
    controller.step()
    assert _take_reply(good)["op"] == "registered"
    assert controller.errors == errors + 1


@pytest.mark.parametrize("fields, named", [
    ({"max": 2**64 - 1}, "Dim.max"),
    ({"splittable": "no"}, "Dim.splittable"),
    ({"pad_value": "x"}, "Dim.pad_value"),
])
def test_a_registration_the_client_would_refuse_is_refused_naming_the_field(
    controller: Controller, worker: Callable[..., Worker], clock: FakeClock, fields: dict,
    named: str
) -> None:
    w = worker()
    message = protocol.register_message(0, "decode", {"B": Dim(max=64)})
    message["dims"][0][1].update(fields)
    assert w.registry.requests(w.slot).post(message)
    controller.step()
    with pytest.raises(ShapeError, match=named):
        mailbox.raise_for_error(_take_reply(w))
    assert controller.devices.get(0) is None or "decode" not in controller.devices[0].profiles
    errors = controller.errors
    other = worker()
    other.register(0, "decode", serve=controller.step)
    for _ in range(30):  # rounds and status go on
        clock.advance(0.1)
        other.put(0, 40)
        controller.step()
    assert controller.errors == errors and controller.rounds["count"] >= 1


def test_a_profile_whose_round_fails_keeps_its_gears_and_the_others_are_decided(
    controller: Controller, worker: Callable[..., Worker], clock: FakeClock
) -> None:
    w = worker()
    w.register(0, "broken", serve=controller.step)
    w.register(1, "decode", serve=controller.step)

    class Broken:
        history = None

        def snapshot(self) -> Broken:  # what a round in another thread reads
            return self

        def view(self, now: float) -> object:
            raise OverflowError("a statistic no registration can make")

    stats = controller.devices[0].profiles["broken"].stats
    real, stats["B"] = stats["B"], Broken()  # type: ignore[assignment]
    before = controller.devices[0].profiles["broken"].gear_lists()
    for _ in range(120):
        clock.advance(0.1)
        w.put(1, 40)
        controller.step()
    gears = w.gears("decode")
    assert gears is not None and 40 in gears["B"]  # decided and published
    assert controller.devices[0].profiles["broken"].gear_lists() == before
    assert controller.errors > 0
    stats["B"] = real  # else the final save fails, and close() says so


def test_a_device_takes_a_bounded_number_of_profiles(
    controller: Controller, worker: Callable[..., Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(registrations, "MAX_PROFILES", 2)
    w = worker()
    w.register(0, "a", serve=controller.step)
    w.register(1, "b", serve=controller.step)
    with pytest.raises(NamespaceBusy, match="device 0 holds 2 profiles"):
        w.register(2, "c", serve=controller.step)
    assert w.register(3, "a", serve=controller.step)["op"] == "registered"  # a known one


def test_a_corrupt_slot_is_counted_shown_and_skipped(
    controller: Controller, worker: Callable[..., Worker], clock: FakeClock
) -> None:
    bad, good = worker(), worker()
    good.register(0, "decode", serve=controller.step)
    words = controller.registry.segment.words
    base = (control.TABLE + bad.slot * words[control.SLOT_SIZE]) // 8  # the header's
    words[base + control.STATE // 8] = 99  # no SlotState
    for _ in range(10):
        clock.advance(0.1)
        good.put(0, 40)
        controller.step()
    assert controller.counts["corrupt_slots"] == 1 and controller.counts["folded"] == 10
    assert controller.status_document(clock.now())["events"]["corrupt_slots"] == 1
    shown = subprocess.run(
        [sys.executable, "-m", "gearshift", "status", "-n", controller.config.namespace],
        capture_output=True, text=True, timeout=WAIT,
    )
    assert shown.returncode == 0 and "corrupt" in shown.stdout, shown.stderr


def test_a_ring_created_but_not_sealed_never_stalls_the_loop(
    controller: Controller, worker: Callable[..., Worker], clock: FakeClock
) -> None:
    good = worker()
    good.register(0, "decode", serve=controller.step)
    registry = Registry.attach(controller.config.namespace)
    slot = registry.claim_slot(0)  # a worker stopped between creating and sealing its ring
    size = ring.RECORDS + 64 * ring.RECORD
    unsealed = Segment.create(names.ring(controller.config.namespace, slot), size)
    wall = MonotonicClock()
    try:
        for _ in range(20):
            clock.advance(controller.config.scan_interval_seconds)
            good.put(0, 40)
            began = wall.now()
            controller.step()
            assert wall.now() - began < 0.1
        assert controller.counts["folded"] == 20
        unsealed.seal(ring.MAGIC, ring.LAYOUT, (64, ring.RECORD))
        clock.advance(controller.config.scan_interval_seconds)
        controller.step()
        assert controller.workers[slot].ring is not None  # attached at the next scan
        assert isinstance(controller.workers[slot].ring, EventRing)
    finally:
        unsealed.close()
        registry.release_slot(slot)
        registry.close()


def test_an_overwritten_controller_identity_is_claimed_again(
    controller: Controller, worker: Callable[..., Worker]
) -> None:
    words = controller.registry.segment.words
    words[control.CONTROLLER // 8] = 12345  # no live process
    controller.step()
    assert controller.registry.owns_controller()
    assert controller.registry.controller().pid == os.getpid()
    assert worker().register(0, "decode", serve=controller.step)["op"] == "registered"


def test_a_registration_whose_region_has_no_room_is_refused_alone_and_tried_again(
    controller: Controller, worker: Callable[..., Worker], monkeypatch: pytest.MonkeyPatch
) -> None:
    full = {"yes": True}

    def open_region(namespace: str, device: int) -> SnapshotRegion:
        if device == 1 and full["yes"]:
            raise segment.no_space(names.snapshot(namespace, device), 524544)
        return SnapshotRegion.open(namespace, device)

    monkeypatch.setattr(controller, "region_type", type("Regions", (), {"open": open_region}))
    first, second = worker(0), worker(1)
    assert first.register(0, "a", serve=controller.step)["op"] == "registered"
    with pytest.raises(SpaceError, match=r"no room for /gearshift\..*\.snap\.1: it needs 524544"):
        second.register(0, "a", serve=controller.step)
    assert 1 not in controller.devices or not controller.devices[1].profiles  # nothing kept
    assert controller.errors == 0
    full["yes"] = False  # room again: the next registration gets its region
    assert second.register(0, "a", serve=controller.step)["op"] == "registered"
    assert second.gears("a") is not None
