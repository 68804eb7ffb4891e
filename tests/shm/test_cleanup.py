from __future__ import annotations

import os
from multiprocessing.context import BaseContext

import pytest

from gearshift.errors import ControllerNotFound, ControllerRunning, NamespaceBusy
from gearshift.shm import EventRing, Registry, SnapshotRegion, cleanup, names
from gearshift.shm.segment import SHM_DIR, exists
from shm.procs import WAIT, Spawn, claim_put_exit, control_until


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
