from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from multiprocessing.context import BaseContext

import pytest
from fakeclock import FakeClock

from gearshift.errors import (
    ConfigError,
    ControllerNotFound,
    ControllerRunning,
    LayoutError,
    NamespaceBusy,
    ProfileMismatch,
)
from gearshift.shm import (
    EventRing,
    Registry,
    SlotState,
    control,
    error_reply,
    names,
    ring,
    segment,
)
from gearshift.shm.segment import Segment, exists
from shm.procs import (
    WAIT,
    Spawn,
    acquire_and_die_unrecorded,
    claim_and_hold,
    claim_put_exit,
    control_until,
    hold_unrecorded_until,
    layout_table,
    lock_and_die,
    register_profile,
)

SLOTS = 4


@pytest.fixture
def registry(namespace: str) -> Iterator[Registry]:
    created = Registry.create(namespace, slots=SLOTS)
    yield created
    created.unlink()
    created.close()


def test_layout_table_matches_the_code() -> None:
    M = control.DEFAULT_MAILBOX_CAPACITY
    S, i = 128 + 2 * (64 + M), 2
    table = layout_table(control.__doc__, i=i, S=S, M=M)
    slot = control.TABLE + i * S
    assert {field: offset for field, (offset, _) in table.items()} == {
        "magic": 0,
        "layout": 8,
        "slots": control.SLOTS * 8,
        "slot_size": control.SLOT_SIZE * 8,
        "mailbox_capacity": control.MAILBOX_CAPACITY * 8,
        "closed": control.CLOSED,
        "controller": control.CONTROLLER,
        "controller_beat": control.CONTROLLER_BEAT,
        "lock_owner": control.LOCK_OWNER,
        "lock_count": control.LOCK_COUNT,
        "high_water": control.HIGH_WATER,
        "lock_realm": control.LOCK_REALM,
        "controller_realm": control.CONTROLLER_REALM,
        "controller_beats": control.CONTROLLER_BEATS,
        "discarded": control.DISCARDED,
        "state[i]": slot + control.STATE,
        "ident[i]": slot + control.IDENT,
        "device[i]": slot + control.DEVICE,
        "generation[i]": slot + control.GENERATION,
        "heartbeat[i]": slot + control.HEARTBEAT,
        "applied[i]": slot + control.APPLIED,
        "dropped[i]": slot + control.DROPPED,
        "realm[i]": slot + control.REALM,
        "beats[i]": slot + control.BEATS,
        "requests[i]": slot + control.REQUESTS,
        "replies[i]": slot + control.REQUESTS + 64 + M,
    }
    assert table["replies[i]"][1] == 64 + M


def test_claim_beat_release_and_the_table(registry: Registry) -> None:
    slot = registry.claim_slot(device=1)
    registry.beat(slot, now_ns=123, applied_version=7, dropped=2)
    info = registry.slots()[slot]
    assert info[:] == (slot, SlotState.ACTIVE, os.getpid(), True, 1, 1, 123, 7, 2, False, True)
    assert not info.reclaimable
    assert registry.release_slot(slot)
    assert not registry.release_slot(slot)  # not ACTIVE any more
    assert registry.slots()[slot].reclaimable


def test_slots_run_out_with_a_clear_error(registry: Registry) -> None:
    assert sorted(registry.claim_slot(0) for _ in range(SLOTS)) == list(range(SLOTS))
    with pytest.raises(NamespaceBusy, match=f"all {SLOTS} worker slots"):
        registry.claim_slot(0)


def test_slot_claims_racing_between_processes_never_share_a_slot(
    namespace: str, registry: Registry, mp: BaseContext, spawn: Spawn
) -> None:
    go, stop, results = mp.Event(), mp.Event(), mp.Queue()
    for _ in range(SLOTS + 2):
        spawn(claim_and_hold, namespace, go, results, stop)
    go.set()
    claims = [results.get(timeout=WAIT) for _ in range(SLOTS + 2)]
    stop.set()
    assert sorted(c for c in claims if isinstance(c, int)) == list(range(SLOTS))
    assert sorted(c for c in claims if isinstance(c, str)) == ["NamespaceBusy"] * 2


def test_a_dead_workers_slot_is_reclaimed_only_after_its_ring_was_drained(
    namespace: str, registry: Registry, spawn: Spawn
) -> None:
    worker = spawn(claim_put_exit, namespace, 5)
    worker.join(WAIT)
    (info,) = [i for i in registry.slots() if i.state == SlotState.ACTIVE]
    assert (info.pid, info.alive, info.device, info.reclaimable) == (worker.pid, False, 3, True)
    with pytest.raises(NamespaceBusy, match="attach and drain"):
        registry.reclaim(info.slot, None)
    consumer = EventRing.attach(namespace, info.slot)
    try:
        with pytest.raises(NamespaceBusy, match="still holds 5 events"):
            registry.reclaim(info.slot, consumer)
        assert len(consumer.drain()) == 5
        registry.reclaim(info.slot, consumer)
    finally:
        consumer.close()
    assert not exists(names.ring(namespace, info.slot))
    assert registry.slots()[info.slot].state == SlotState.FREE
    assert registry.claim_slot(0) == info.slot
    assert registry.slots()[info.slot].generation == 2


def test_a_reclaimed_slot_reads_free_only_once_its_rings_memory_is_unmapped(
    namespace: str, registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tmpfs object's pages are freed when its last mapping goes, not at unlink: a slot
    that read FREE while the reclaimer still mapped the unlinked ring promised room that was
    not there yet (a worker taking the slot could fail to create its ring; under load the
    full-/dev/shm test saw a registration succeed where none had room)."""
    slot = registry.claim_slot(0)
    ring = EventRing.create(namespace, slot, 8)
    registry.release_slot(slot)
    mapped_when_freed: list[bool] = []
    set_slot = registry._set_slot

    def watching(slot_: int, offset: int, value: int) -> None:
        if offset == control.STATE and value == SlotState.FREE:
            mapped_when_freed.append(not ring.segment.mm.closed)
        set_slot(slot_, offset, value)

    monkeypatch.setattr(registry, "_set_slot", watching)
    registry.reclaim(slot, ring)
    ring.close()  # the reclaimer's own close after it: a no-op now
    assert mapped_when_freed == [False]
    assert registry.slots()[slot].state == SlotState.FREE


def test_a_worker_dead_before_creating_its_ring_is_reclaimed_without_one(
    registry: Registry,
) -> None:
    slot = registry.claim_slot(0)
    registry.release_slot(slot)
    registry.reclaim(slot, None)
    assert registry.slots()[slot].state == SlotState.FREE


def test_a_live_workers_slot_is_never_reclaimed(namespace: str, registry: Registry) -> None:
    slot = registry.claim_slot(0)
    producer = EventRing.create(namespace, slot, 8)
    try:
        with pytest.raises(NamespaceBusy, match="live pid"):
            registry.reclaim(slot, producer)
    finally:
        producer.unlink()
        producer.close()


def test_a_second_live_controller_is_refused_and_a_dead_ones_place_is_taken(
    namespace: str, registry: Registry, mp: BaseContext, spawn: Spawn
) -> None:
    started, stop = mp.Event(), mp.Event()
    other = spawn(control_until, namespace, started, stop)
    assert started.wait(WAIT)
    assert registry.controller()[:2] == (other.pid, True)
    with pytest.raises(ControllerRunning, match=f"pid {other.pid}"):
        registry.claim_controller()
    stop.set()
    other.join(WAIT)
    registry.claim_controller()  # its controller died without releasing: take over
    registry.beat_controller(99)
    assert registry.controller()[:3] == (os.getpid(), True, 99)
    registry.release_controller()
    assert registry.controller().pid == 0


def test_a_lock_held_by_a_dead_process_is_reported_and_repaired(
    namespace: str, registry: Registry, spawn: Spawn
) -> None:
    holder = spawn(lock_and_die, namespace)
    holder.join(WAIT)
    registry.lock.timeout = 0.05
    with pytest.raises(NamespaceBusy, match=f"pid {holder.pid} \\(dead"):
        registry.claim_slot(0)
    assert registry.repair_lock()
    assert not registry.repair_lock()
    assert registry.claim_slot(0) == 0


def test_a_lock_left_held_unrecorded_by_a_dead_process_is_repaired_after_a_timeout(
    namespace: str, registry: Registry, spawn: Spawn
) -> None:
    holder = spawn(acquire_and_die_unrecorded, namespace)
    holder.join(WAIT)
    registry.lock.timeout = 0.05
    with pytest.raises(NamespaceBusy, match="pid 0"):
        registry.claim_slot(0)
    assert registry.repair_lock()
    assert not registry.repair_lock()  # free now
    assert registry.claim_slot(0) == 0


def test_a_live_holders_lock_is_not_repaired_before_a_whole_timeout(
    namespace: str, registry: Registry, mp: BaseContext, spawn: Spawn
) -> None:
    """A live holder, unrecorded, passes through at 0.9 of `lock.timeout` (virtual time, the
    repairer's injected clock): the repair leaves the lock alone and it counts 1, not 2
    (mutations caught: no wait for an unrecorded holder, or a wait shorter than `timeout`)."""
    held, release, released = mp.Event(), mp.Event(), mp.Event()
    spawn(hold_unrecorded_until, namespace, held, release, released)
    assert held.wait(WAIT)
    registry.lock.timeout = 1.0

    class Passing(FakeClock):
        """The holder releases once the repairer has waited 0.9 s."""

        def sleep(self, seconds: float) -> None:
            super().sleep(seconds)
            if self.now() >= 0.9 and not release.is_set():
                release.set()
                assert released.wait(WAIT)

    clock = Passing()
    try:
        assert not registry.repair_lock(clock)
    finally:
        release.set()
    assert released.wait(WAIT) and clock.now() >= 0.9
    assert registry.lock.value == 1  # released once, by its holder
    assert registry.claim_slot(0) == 0


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ({"profile_id": 0}, ("ok", {"profile_id": 0})),
        (
            error_reply(ProfileMismatch("decode: gears differ")),
            ("ProfileMismatch", "decode: gears differ"),
        ),
    ],
)
def test_registration_round_trip_between_worker_and_controller(
    namespace: str, registry: Registry, mp: BaseContext, spawn: Spawn, reply: dict, expected: tuple
) -> None:
    results = mp.Queue()
    spawn(register_profile, namespace, results)
    deadline = time.monotonic() + WAIT
    while (request := registry.requests(0).take()) is None and time.monotonic() < deadline:
        time.sleep(0.001)  # the worker claims slot 0, the first free one
    assert request == {"op": "register", "name": "decode", "dims": {"B": [1, 2, 4]}}
    registry.replies(0).post(reply)
    assert results.get(timeout=WAIT) == expected


def test_open_creates_or_attaches(namespace: str) -> None:
    first = Registry.open(namespace, slots=2)
    second = Registry.open(namespace, slots=8)
    try:
        assert second.nslots == 2
        assert second.claim_slot(0) == 0 and first.slots()[0].state == SlotState.ACTIVE
    finally:
        second.close()
        first.unlink()
        first.close()


def test_attaching_a_missing_namespace_says_no_controller(namespace: str) -> None:
    with pytest.raises(ControllerNotFound):
        Registry.attach(namespace)


def test_a_wrong_magic_or_newer_layout_is_refused(namespace: str) -> None:
    for magic, layout in ((ring.MAGIC, control.LAYOUT), (control.MAGIC, control.LAYOUT + 1)):
        fake = Segment.create(names.control(namespace), 4096).seal(magic, layout, (1, 64, 64))
        try:
            with pytest.raises(LayoutError):
                Registry.attach(namespace)
        finally:
            fake.unlink()
            fake.close()


def test_a_retired_namespace_refuses_new_claims(registry: Registry) -> None:
    registry.retire()
    with pytest.raises(ControllerNotFound, match="cleaned up"):
        registry.claim_slot(0)


def test_a_corrupt_slot_is_isolated_and_the_table_still_reads(
    namespace: str, registry: Registry
) -> None:
    first, second = registry.claim_slot(0), registry.claim_slot(1)
    words = registry.segment.words
    base = (control.TABLE + second * words[control.SLOT_SIZE]) // 8  # the header's
    words[base + control.STATE // 8] = 7  # no SlotState
    infos = registry.slots()
    assert [i.state for i in infos[:3]] == [SlotState.ACTIVE, SlotState.CORRUPT, SlotState.FREE]
    assert not infos[second].alive and not infos[second].reclaimable
    words[base + control.STATE // 8] = SlotState.ACTIVE
    words[base + control.DEVICE // 8] = control.MAX_DEVICE + 1  # no device of ours
    assert registry.slots()[second].state == SlotState.CORRUPT
    words[base + control.GENERATION // 8] = (1 << 64) - 1
    words[base + control.STATE // 8] = SlotState.FREE
    assert registry.claim_slot(0) == second  # a wild generation wraps, never overflows
    assert registry.slots()[second].generation == 0 and registry.slots()[first].alive


@pytest.mark.parametrize("device", [-1, control.MAX_DEVICE + 1, 2**64, True, 1.0])
def test_a_device_outside_the_range_is_refused_naming_it(
    registry: Registry, device: object
) -> None:
    with pytest.raises(ConfigError, match="device: expected an int in"):
        registry.claim_slot(device)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "constants",
    [(control.MAX_SLOTS + 1, control.REQUESTS + 2 * 128, 64), (1, 64 + 2 * (64 + 2**21), 2**21)],
)
def test_header_constants_beyond_the_layout_bounds_are_refused(
    namespace: str, constants: tuple[int, int, int]
) -> None:
    size = control.TABLE + constants[0] * constants[1]  # a sparse file: any size is free
    fake = Segment.create(names.control(namespace), -(-size // 64) * 64)
    fake.seal(control.MAGIC, control.LAYOUT, constants)
    try:
        with pytest.raises(LayoutError, match="do not fit"):
            Registry.attach(namespace)
    finally:
        fake.unlink()
        fake.close()


def test_two_repairers_at_once_release_a_dead_holders_lock_once(
    namespace: str, registry: Registry, spawn: Spawn
) -> None:
    spawn(lock_and_die, namespace).join(WAIT)
    fd = os.open(segment.path(names.control(namespace)), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another repairer is at it
        assert not registry.repair_lock()
        assert registry.lock.value == 0
    finally:
        os.close(fd)
    assert registry.repair_lock()
    assert not registry.repair_lock()
    assert registry.lock.value == 1


def test_the_high_water_mark_follows_the_claims_and_bounds_the_table_read(
    registry: Registry,
) -> None:
    assert registry.high_water() == 0 and registry.slots(registry.high_water()) == []
    first, second = registry.claim_slot(0), registry.claim_slot(0)
    assert registry.high_water() == 2
    registry.release_slot(second)
    assert [i.slot for i in registry.slots(registry.high_water())] == [first, second]
    assert len(registry.slots()) == SLOTS
