"""A full /dev/shm (a private tmpfs, `faults.full_shm`): no process dies of SIGBUS; a worker
with no room for its ring serves unrecorded and gets one at a later try, the controller refuses
a registration whose region has no room (the worker serves on its initial gears and registers
later) and goes on consuming the other workers' events."""

from __future__ import annotations

import logging

import pytest

import gearshift as gs
from gearshift.shm import EventRing, names, segment
from gearshift.tools.stress import faults
from gearshift.worker import Client
from worker.fake_controller import FakeController, ServingClock

DIMS = {"SEQLEN": gs.Dim(max=4096)}


def test_a_worker_with_no_room_for_its_ring_serves_unrecorded_says_so_once_and_tries_later(
    fake: FakeController, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    room, create = [False], EventRing.create

    def create_if_room(namespace: str, slot: int, capacity: int) -> EventRing:
        if not room[0]:  # what Segment.create raises on a full /dev/shm (test_space.py)
            raise segment.no_space(names.ring(namespace, slot), 4194560)
        return create(namespace, slot, capacity)

    monkeypatch.setattr(EventRing, "create", staticmethod(create_if_room))
    clock = ServingClock(fake.serve)
    with caplog.at_level(logging.WARNING, "gearshift"):
        client = Client(fake.namespace, 0, clock=clock, background=False)
        prof = client.profile("prefill", DIMS)
        for size in range(1, 101):
            prof.route(SEQLEN=size)
            client._tick()
            clock.advance(0.01)  # one second in all: within the retry interval
    try:
        assert client.slot is None and client.unrecorded == 100  # served, counted
        assert [r.message.count("no room for /gearshift.") for r in caplog.records] == [1]
        room[0] = True
        client._tick()
        assert client.slot is None  # no try before retry_interval
        clock.advance(client.retry_interval)
        client._tick()
        assert client.slot is not None and not prof.registered
        clock.sleep(0)  # the controller answers
        client._tick()
        assert prof.registered
        prof.route(SEQLEN=7)
        assert len(fake.drain(client.slot)) == 1  # recorded from then on
    finally:
        client.close()


def test_a_registration_refused_for_want_of_room_serves_the_initial_gears_and_is_tried_later(
    fake: FakeController, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    room, tries, register = [False], [], fake.register

    def register_if_room(slot: int, request: object, new: bool, now: float) -> int:
        tries.append(slot)
        if not room[0]:  # what the controller answers when the device's region has no room
            raise segment.no_space(names.snapshot(fake.namespace, 0), 524544)
        return register(slot, request, new, now)

    monkeypatch.setattr(fake, "register", register_if_room)
    clock = ServingClock(fake.serve)
    client = Client(fake.namespace, 0, clock=clock, background=False)
    try:
        with caplog.at_level(logging.WARNING, "gearshift"):
            prof = client.profile("prefill", DIMS)  # no exception: refused for now
        assert not prof.registered and prof.route(SEQLEN=100).gears["SEQLEN"] == 128
        assert len(tries) == 1 and "registration of profile 'prefill' held" in caplog.text
        room[0] = True
        client._tick()
        clock.sleep(0)
        assert len(tries) == 1  # nothing posted again before retry_interval
        clock.advance(client.retry_interval)
        client._tick()
        clock.sleep(0)
        client._tick()
        assert len(tries) == 2 and prof.registered
    finally:
        client.close()


def test_a_worker_and_the_controller_survive_a_full_dev_shm() -> None:
    found = faults.full_shm()
    if found is None:
        pytest.skip("no private mount namespace with a tmpfs on /dev/shm can be made here")
    assert found["exit"] == 0, found["log"]
    assert found["serve_exit"] == 0, found["serve_log"]  # before: SIGBUS (-7)
    assert found["serve_warned"]  # /dev/shm is smaller than its 4 slots need
    b, c = found["b"], found["c"]
    assert b["exit"] == 0 and b["slot"] is None, b["log"]  # before: SIGBUS
    assert b["unrecorded"] == faults.B_ROUTES and b["attached"]  # its ring at a later try
    assert b["log"].count("no room for /gearshift.") == 1  # said once
    assert c["exit"] == 0 and c["slot"] is not None, c["log"]  # before: SIGBUS
    assert not c["registered"] and c["routed"] == 100  # refused for now: its initial gears
    assert c["log"].count(".snap.1: it needs") == 1 and "--shm-size" in c["log"]
    assert c["registered_later"]  # at a later try, once there was room for the region
    assert found["all_consumed"] and found["consumed"] == found["recorded"]
