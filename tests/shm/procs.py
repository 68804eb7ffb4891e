"""Helpers of the shm tests: self-checking records, layout-table parsing, and the bodies of the
child processes (importable by multiprocessing's forkserver)."""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier, Event

import numpy as np
import posix_ipc

from gearshift.errors import GearshiftError
from gearshift.shm import EventRing, Registry, SnapshotRegion, mailbox, names

Spawn = Callable[..., BaseProcess]  # the `spawn` fixture: start target(*args) in a child
WAIT = 20.0  # seconds: the bound of every wait in a child (the parent's joins are bounded too)

# -- self-checking records: every field is derived from the sequence number in t_ns --


def record(seq: int) -> tuple:
    """put() arguments of record `seq`."""
    values = (seq * 3 + 1, seq ^ 0x5A5A5A5A, -seq, seq * 7 % 1_000_003)
    chunks = (seq % 65535, (seq >> 16) % 65535, 1, 2)
    return seq, seq % 65521, seq & 0xFFFFFFFF, values, chunks


def intact(events: np.ndarray) -> np.ndarray:
    """Per event: does every field match the one derived from its t_ns?"""
    seq = events["t_ns"]
    values = np.stack([seq * 3 + 1, seq ^ 0x5A5A5A5A, -seq, seq * 7 % 1_000_003], axis=1)
    chunks = np.stack([seq % 65535, (seq >> 16) % 65535, seq * 0 + 1, seq * 0 + 2], axis=1)
    return (
        (events["values"] == values).all(axis=1)
        & (events["chunks"] == chunks).all(axis=1)
        & (events["profile"] == seq % 65521)
        & (events["version"] == seq & 0xFFFFFFFF)
        & (events["kind"] == 1)
        & (events["ndim"] == 4)
    )


# -- layout tables of the module docstrings --

_ROW = re.compile(r"^ {4}(?P<offset>\d[^ ]*(?: [+*] [^ ]+)*)  +(?P<size>\S+)  +(?P<field>\S+)")


def layout_table(doc: str, **names: int) -> dict[str, tuple[int, int | str]]:
    """field -> (offset, size) of each row of a docstring layout table, the expressions evaluated
    with `names` bound (a size naming an unbound variable stays a string)."""
    rows = (m for m in map(_ROW.match, doc.splitlines()) if m)
    return {m["field"]: (eval(m["offset"], {}, names), _size(m["size"], names)) for m in rows}


def _size(expression: str, names: dict[str, int]) -> int | str:
    try:
        return eval(expression, {}, names)
    except NameError:
        return expression


# -- child process bodies --


def produce(namespace: str, slot: int, count: int) -> None:
    """Put records 0..count-1 into the ring of `slot` as fast as possible."""
    ring = EventRing.attach(namespace, slot)
    for seq in range(count):
        ring.put(*record(seq))
    ring.close()


def produce_forever(namespace: str, slot: int, started: Event) -> None:
    """Put records 0, 1, 2, ... until killed."""
    ring = EventRing.attach(namespace, slot)
    ring.put(*record(0))
    started.set()
    seq = 1
    while True:
        ring.put(*record(seq))
        seq += 1


def snapshot_payload(version: int) -> dict:
    """A payload that carries its own version and a digest of a body of varying length."""
    body = hashlib.sha256(str(version).encode()).digest() * (1 + version % 500)
    return {"version": version, "body": body, "digest": hashlib.sha256(body).hexdigest()}


def publish_until(namespace: str, device: int, start: Barrier, stop: Event) -> None:
    region = SnapshotRegion.attach(namespace, device)
    start.wait(WAIT)
    while not stop.is_set():
        region.publish(snapshot_payload(region.version() + 1))
    region.close()


def read_until(namespace: str, device: int, start: Barrier, stop: Event, results: Queue) -> None:
    """Read snapshots until `stop`; report (accepted, torn, distinct versions, monotonic)."""
    region = SnapshotRegion.attach(namespace, device)
    start.wait(WAIT)
    accepted = torn = 0
    versions = set()
    last = 0
    monotonic = True
    while not stop.is_set():
        snapshot = region.read()
        payload = snapshot.payload
        good = (
            payload["version"] == snapshot.version
            and hashlib.sha256(payload["body"]).hexdigest() == payload["digest"]
        )
        accepted += good
        torn += not good
        monotonic &= snapshot.version >= last
        last = snapshot.version
        versions.add(snapshot.version)
    region.close()
    results.put((accepted, torn, len(versions), monotonic))


def claim_and_hold(namespace: str, go: Event, results: Queue, stop: Event) -> None:
    """Claim a slot when `go` is set, report it (or the error), hold it until `stop`."""
    registry = Registry.attach(namespace)
    go.wait(WAIT)
    try:
        results.put(registry.claim_slot(device=0))
    except GearshiftError as exc:
        results.put(type(exc).__name__)
    stop.wait(WAIT)
    registry.close()


def claim_put_exit(namespace: str, events: int) -> None:
    """Claim a slot, create its ring, put `events` records and exit without releasing."""
    registry = Registry.attach(namespace)
    slot = registry.claim_slot(device=3)
    ring = EventRing.create(namespace, slot, 64)
    for seq in range(events):
        ring.put(*record(seq))
    os._exit(0)


def lock_and_die(namespace: str) -> None:
    """Die while holding the namespace lock."""
    registry = Registry.attach(namespace)
    held = registry.lock.held(registry.wait)  # kept: collecting it would release the lock
    held.__enter__()
    os._exit(0)


def hold_unrecorded_until(namespace: str, held: Event, release: Event, released: Event) -> None:
    """Hold the namespace lock, alive and unrecorded (a holder that has not recorded itself
    yet), until `release`; then release it."""
    Registry.attach(namespace)
    sem = posix_ipc.Semaphore(names.lock(namespace))  # the lock's semaphore, by its name
    sem.acquire()
    held.set()
    release.wait(WAIT)
    sem.release()
    released.set()


def acquire_and_die_unrecorded(namespace: str) -> None:
    """Die holding the namespace lock before recording itself as its holder."""
    Registry.attach(namespace)
    posix_ipc.Semaphore(names.lock(namespace)).acquire()
    os._exit(0)


def control_until(namespace: str, started: Event, stop: Event) -> None:
    registry = Registry.attach(namespace)
    registry.claim_controller()
    started.set()
    stop.wait(WAIT)
    os._exit(0)  # dies as controller, without releasing


def register_profile(namespace: str, results: Queue) -> None:
    """A worker's registration round trip: post a request, wait for the reply, report it."""
    registry = Registry.attach(namespace)
    slot = registry.claim_slot(device=0)
    registry.requests(slot).post({"op": "register", "name": "decode", "dims": {"B": [1, 2, 4]}})
    deadline = time.monotonic() + WAIT
    while (reply := registry.replies(slot).take()) is None and time.monotonic() < deadline:
        time.sleep(0.001)
    try:
        results.put(("ok", mailbox.raise_for_error(reply)))
    except GearshiftError as exc:
        results.put((type(exc).__name__, str(exc)))
    registry.release_slot(slot)
    registry.close()


# -- another user (run by root only: the child drops to uid/gid NOBODY first) --

NOBODY = 65534


def become(uid: int) -> None:
    """Drop every privilege: this process is user `uid` (group `uid`, no other groups)."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def squat(names_: list[str], lock: str | None, results: Queue) -> None:
    """As NOBODY, create the shared-memory objects `names_` (and the semaphore `lock`) with
    mode 0666, as a co-tenant guessing a namespace would, before its owner starts."""
    import posix_ipc

    become(NOBODY)
    os.umask(0)
    for name in names_:
        posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o666, size=4096).close_fd()
    if lock is not None:
        posix_ipc.Semaphore(lock, posix_ipc.O_CREX, mode=0o666, initial_value=1).close()
    results.put("squatted")


def attack(namespace: str, results: Queue) -> None:
    """As NOBODY, try to attach, write and remove the objects of another user's namespace;
    report what each attempt raised (type, message)."""
    import posix_ipc

    from gearshift.shm import cleanup, names

    become(NOBODY)
    outcomes = {}
    attempts = {
        "registry": lambda: Registry.attach(namespace),
        "snapshot": lambda: SnapshotRegion.attach(namespace, 0),
        "ring": lambda: EventRing.attach(namespace, 0),
        "write": lambda: posix_ipc.SharedMemory(names.control(namespace), 0, mode=0o666),
        "unlink": lambda: posix_ipc.unlink_shared_memory(names.control(namespace)),
        "cleanup": lambda: cleanup(namespace),
    }
    for what, attempt in attempts.items():
        try:
            attempt()
            outcomes[what] = ("no error", "")
        except Exception as exc:  # report every outcome, typed or not
            outcomes[what] = (type(exc).__name__, str(exc))
    results.put(outcomes)


def retire_then(namespace: str, retired: Event, go: Event | None) -> None:
    """A cleanup that closes the namespace, then dies (`go` None) or, once `go` is set,
    removes it."""
    from gearshift.shm import cleanup

    registry = Registry.attach(namespace)
    registry.retire()
    retired.set()
    if go is None:
        os._exit(0)
    go.wait(WAIT)
    cleanup(namespace)
    os._exit(0)


def lock_and_stop(namespace: str) -> None:
    """Take the namespace lock, then stop (SIGSTOP) holding it, until killed."""
    import signal

    registry = Registry.attach(namespace)
    held = registry.lock.held(registry.wait)  # kept: collecting it would release the lock
    held.__enter__()
    os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(WAIT)
    os._exit(0)


def register_put_exit(namespace: str, events: int) -> None:
    """A worker that claims a slot, puts `events` records of profile id 0, posts its
    registration and exits before any answer (without releasing its slot)."""
    from gearshift import protocol
    from gearshift.core.dims import Dim

    registry = Registry.attach(namespace)
    slot = registry.claim_slot(device=0)
    ring = EventRing.create(namespace, slot, 1 << 12)
    for _ in range(events):
        assert ring.put(time.monotonic_ns(), 0, 0, (3,), (1,))
    dims = {"B": Dim(gears=[1, 2, 4, 8, 16, 32, 64], max=64)}
    assert registry.requests(slot).post(protocol.register_message(0, "decode", dims))
    os._exit(0)


def claim_and_sleep(namespace: str) -> None:
    """Claim a slot (device 0) and sleep until killed: run in another pid namespace."""
    registry = Registry.attach(namespace)
    registry.claim_slot(device=0)
    print("claimed", flush=True)
    time.sleep(WAIT)
