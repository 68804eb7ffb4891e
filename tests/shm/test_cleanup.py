from __future__ import annotations

import os
import time
from multiprocessing.context import BaseContext

import pytest
from fakeclock import FakeClock

from gearshift.errors import ControllerNotFound, ControllerRunning, NamespaceBusy
from gearshift.shm import EventRing, Registry, SnapshotRegion, cleanup, names, segment
from gearshift.shm.cleanup import _remove, own
from gearshift.shm.lock import semaphore_name
from gearshift.shm.segment import SHM_DIR, exists
from shm.procs import WAIT, Spawn, claim_put_exit, control_until, retire_then


def _objects(namespace: str) -> list[str]:
    """The /dev/shm entries of `namespace`: its segments and its lock."""
    pattern, lock = (
        names.segment_pattern(namespace),
        f"sem{names.lock(namespace).replace('/', '.')}",
    )
    return sorted(n for n in os.listdir(SHM_DIR) if pattern.fullmatch(n) or n == lock)


def test_a_dead_namespace_is_removed_entirely(namespace: str, spawn: Spawn) -> None:
    registry = Registry.create(namespace, slots=2)
    spawn(claim_put_exit, namespace, 3).join(WAIT)  # a worker that died with its ring
    SnapshotRegion.create(namespace, 0).close()
    SnapshotRegion.create_named(names.status(namespace), 4096).close()
    late = Registry.attach(namespace)  # a worker that attached just before cleanup
    registry.close()
    other = EventRing.create(f"{namespace}.b", 0, 8)  # another namespace sharing the prefix
    try:
        removed = cleanup(namespace)
        kinds = ("ctl", "ring.0", "snap.0", "status")
        assert removed == [f"/gearshift.{namespace}.{kind}" for kind in kinds]
        assert _objects(namespace) == []
        assert exists(other.name)
        with pytest.raises(ControllerNotFound, match="cleaned up"):
            late.claim_slot(0)
        assert cleanup(namespace) == []
    finally:
        late.close()
        other.unlink()
        other.close()


def test_cleanup_refuses_while_a_worker_lives(namespace: str) -> None:
    registry = Registry.create(namespace)
    registry.claim_slot(0)  # this process is the live worker
    try:
        with pytest.raises(NamespaceBusy, match=f"live worker, pid {os.getpid()}"):
            cleanup(namespace)
        assert _objects(namespace) == [
            f"gearshift.{namespace}.ctl",
            f"sem.gearshift.{namespace}.lock",
        ]
    finally:
        registry.unlink()
        registry.close()


def test_cleanup_refuses_while_the_controller_lives(
    namespace: str, mp: BaseContext, spawn: Spawn
) -> None:
    registry = Registry.create(namespace)
    started, stop = mp.Event(), mp.Event()
    controller = spawn(control_until, namespace, started, stop)
    assert started.wait(WAIT)
    try:
        with pytest.raises(ControllerRunning, match=f"pid {controller.pid}"):
            cleanup(namespace)
        assert len(_objects(namespace)) == 2
    finally:
        stop.set()
        controller.join(WAIT)
    assert cleanup(namespace) == [names.control(namespace)]
    registry.close()


def test_leftovers_without_a_control_segment_are_removed(namespace: str) -> None:
    SnapshotRegion.create(namespace, 2).close()
    assert cleanup(namespace) == [names.snapshot(namespace, 2)]


def test_a_closed_namespace_refuses_a_controller(namespace: str) -> None:
    registry = Registry.create(namespace)
    try:
        registry.retire()
        with pytest.raises(ControllerNotFound, match="being cleaned up"):
            registry.claim_controller()
    finally:
        registry.unlink()
        registry.close()


def test_a_controller_starting_during_a_cleanup_waits_for_it_and_owns_a_fresh_namespace(
    namespace: str, mp: BaseContext, spawn: Spawn
) -> None:
    Registry.create(namespace).close()
    retired, go = mp.Event(), mp.Event()
    spawn(retire_then, namespace, retired, go)
    assert retired.wait(WAIT)
    clock = FakeClock()

    def sleep(seconds: float) -> None:  # the cleanup goes on while `own` waits
        go.set()
        time.sleep(seconds)
        clock.advance(seconds / 100)  # bounded, well within the grace period

    clock.sleep = sleep  # type: ignore[method-assign]
    registry = own(namespace, 4, clock)
    try:
        assert not registry.closed and registry.controller().pid == os.getpid()
        assert registry.segment.inode == _inode(names.control(namespace))  # reachable
        assert registry.lock.inode == _inode(semaphore_name(namespace))
        assert Registry.attach(namespace).claim_slot(0) == 0
    finally:
        registry.unlink()
        registry.close()


def test_a_cleanup_that_died_half_way_is_finished_by_the_next_controller(
    namespace: str, mp: BaseContext, spawn: Spawn
) -> None:
    old = Registry.create(namespace)
    old_inode = old.segment.inode
    old.close()
    retired = mp.Event()
    spawn(retire_then, namespace, retired, None).join(WAIT)
    assert retired.is_set()
    registry = own(namespace, 4)
    try:
        assert registry.segment.inode != old_inode and not registry.closed
    finally:
        registry.unlink()
        registry.close()
    assert _objects(namespace) == []


def test_a_late_cleanup_never_removes_a_namespace_created_after_its_check(
    namespace: str,
) -> None:
    old = Registry.create(namespace)
    old.retire()
    checked = (old.segment.inode, old.lock.inode)
    old.close()
    assert cleanup(namespace) == [names.control(namespace)]
    new = Registry.create(namespace)  # created after the first cleanup finished
    try:
        assert _remove(namespace, *checked) == ([], [])  # the late one's removal: nothing
        assert new.segment.inode == _inode(names.control(namespace))
        assert new.lock.inode == _inode(semaphore_name(namespace))
    finally:
        new.unlink()
        new.close()


def _inode(name: str) -> tuple[int, int] | None:
    info = segment.stat_of(name)
    return None if info is None else (info.st_dev, info.st_ino)
