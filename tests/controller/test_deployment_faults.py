"""The controller against the ways deployments break: a lock holder that dies or stops holding
the namespace lock, a worker that exits before its registration is answered, its own objects
unlinked under it, a worker of another pid namespace. Real processes, real shared memory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fakeclock import FakeClock
from isolated import Isolated, needs_pidns
from shm.procs import (
    WAIT,
    Spawn,
    acquire_and_die_unrecorded,
    lock_and_die,
    lock_and_stop,
    register_put_exit,
)

from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller
from gearshift.errors import NamespaceLost
from gearshift.shm import Registry, SnapshotRegion, cleanup, control, lock, names, segment
from gearshift.shm.lease import LEASE

from .workers import DIMS, POLICY, Worker


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    return stat[stat.rindex(b")") + 2 :].split()[0] == b"T"


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.001)


def test_a_dead_holders_lock_is_released_by_the_next_iteration(
    controller: Controller, spawn: Spawn
) -> None:
    spawn(lock_and_die, controller.config.namespace).join(WAIT)
    assert controller.registry.lock.value == 0
    controller.step()
    assert controller.registry.lock.value == 1
    assert controller.counts["lock_repairs"] == 1


def test_an_unrecorded_dead_holders_lock_is_released_after_one_lock_timeout(
    controller: Controller, clock: FakeClock, spawn: Spawn
) -> None:
    spawn(acquire_and_die_unrecorded, controller.config.namespace).join(WAIT)
    steps = 0
    while controller.registry.lock.value == 0:
        controller.step()
        clock.advance(0.1)  # iterations closer than lock.STALE: one observation
        steps += 1
        assert steps < 100, "never repaired"
    assert steps >= lock.TIMEOUT / 0.1  # never before a whole lock timeout
    assert controller.counts["lock_repairs"] == 1


def test_a_stopped_holder_costs_skipped_scans_never_its_lock_nor_the_drains(
    controller: Controller, clock: FakeClock, worker: Callable[..., Worker], spawn: Spawn
) -> None:
    w = worker()
    w.register(0, "decode", DIMS, serve=controller.step)
    holder = spawn(lock_and_stop, controller.config.namespace)
    try:
        _wait(lambda: _stopped(holder.pid), "the holder to stop")
        assert controller.registry.lock.value == 0
        consumed = controller.counts["consumed"]
        for _ in range(3):
            assert w.put(0, 5)
            clock.advance(controller.config.scan_interval_seconds)
            controller.step()
        assert controller.counts["consumed"] == consumed + 3  # drained without the lock
        assert controller.counts["lock_busy"] >= 3  # each scan skipped, tried again
        assert controller.counts["lock_repairs"] == 0  # a live holder's lock is never taken
        assert controller.registry.lock.value == 0
        controller.registry.release_controller()  # `stop`: no lock needed, no traceback
        assert controller.registry.controller().pid == 0
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(WAIT)
    controller.step()  # dead now: repaired
    assert controller.registry.lock.value == 1


def test_a_worker_gone_before_its_registration_is_answered_loses_no_event(
    controller: Controller, clock: FakeClock, spawn: Spawn
) -> None:
    spawn(register_put_exit, controller.config.namespace, 500).join(WAIT)
    clock.advance(controller.config.scan_interval_seconds)
    controller.step()
    counts = controller.counts
    assert counts["reclaimed_workers"] == 1
    assert counts["unknown"] == 0 and counts["consumed"] == 500
    assert "decode" in controller.devices[0].profiles


def test_a_removed_control_segment_ends_the_loop_with_a_clear_error(
    controller: Controller, clock: FakeClock
) -> None:
    os.unlink(segment.path(names.control(controller.config.namespace)))
    clock.advance(controller.config.scan_interval_seconds)
    with pytest.raises(NamespaceLost, match="RemoveIPC"):
        controller.step()


def test_a_removed_lock_ends_the_loop_with_a_clear_error(
    controller: Controller, clock: FakeClock
) -> None:
    os.unlink(segment.path(lock.semaphore_name(controller.config.namespace)))
    clock.advance(controller.config.scan_interval_seconds)
    with pytest.raises(NamespaceLost, match=r"sem\.gearshift"):
        controller.step()


def test_a_removed_snapshot_region_is_created_and_published_again(
    controller: Controller, clock: FakeClock, worker: Callable[..., Worker]
) -> None:
    w = worker()
    w.register(0, "decode", DIMS, serve=controller.step)
    os.unlink(segment.path(names.snapshot(controller.config.namespace, 0)))
    clock.advance(controller.config.scan_interval_seconds)
    controller.step()
    region = SnapshotRegion.attach(controller.config.namespace, 0)
    try:
        snap = region.read()
        assert snap is not None and "decode" in snap.payload["profiles"]
    finally:
        region.close()


@needs_pidns
def test_a_worker_of_another_pid_namespace_is_kept_while_it_beats_and_reclaimed_after_its_lease(
    controller: Controller, clock: FakeClock
) -> None:
    child = Isolated(f"beating_slot({controller.config.namespace!r}, events=3)")
    observer = Registry.attach(controller.config.namespace)  # reads its beats, judges nothing
    try:
        slot = int(child.expect("claimed").split()[1])
        for _ in range(3 * int(LEASE)):  # fake seconds past the lease; it beats meanwhile
            last = observer.slots()[slot].heartbeat_ns
            _wait(lambda last=last: observer.slots()[slot].heartbeat_ns != last, "its next beat")
            clock.advance(1.0)
            controller.step()
        (info,) = [w.info for w in controller.workers.values()]
        assert info.foreign and info.alive and not info.reclaimable
        assert controller.counts["reclaimed_workers"] == 0
        child.send("die")
        child.wait()
        for _ in range(int(LEASE) + 2):
            clock.advance(1.0)
            controller.step()
        assert controller.counts["reclaimed_workers"] == 1  # within the lease of its last beat
        assert controller.counts["consumed"] == 3  # its ring drained before the reclaim
    finally:
        observer.close()
        child.kill()


def _serve(namespace: str, state: Path) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gearshift", "serve", "-n", namespace, "--state-dir", str(state),
         "--set", "scan_interval_seconds=0.05"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _wait(lambda: segment.exists(names.status(namespace)) or proc.poll() is not None,
          "the controller to start")
    return proc


def test_serve_stops_cleanly_beside_a_stopped_lock_holder(
    namespace: str, tmp_path: Path, spawn: Spawn
) -> None:
    proc = _serve(namespace, tmp_path)
    holder = spawn(lock_and_stop, namespace)
    try:
        _wait(lambda: _stopped(holder.pid), "the holder to stop")
        stop = subprocess.run([sys.executable, "-m", "gearshift", "stop", "-n", namespace],
                              capture_output=True, text=True, timeout=WAIT)
        assert stop.returncode == 0, stop.stderr
        assert proc.wait(WAIT) == 0
        err = proc.stderr.read()
        assert "Traceback" not in err, err
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(WAIT)
        proc.kill()
        proc.wait(WAIT)
        proc.stderr.close()
        cleanup(namespace)


def test_serve_exits_with_a_clear_error_when_its_control_segment_is_removed(
    namespace: str, tmp_path: Path
) -> None:
    proc = _serve(namespace, tmp_path)
    try:
        os.unlink(segment.path(names.control(namespace)))
        assert proc.wait(WAIT) == 1
        err = proc.stderr.read()
        assert "error: namespace" in err and "RemoveIPC" in err and "Traceback" not in err
    finally:
        proc.kill()
        proc.wait(WAIT)
        proc.stderr.close()
        cleanup(namespace)


def test_a_claim_above_the_high_water_mark_is_found_by_the_first_scan(
    config: ControllerConfig, clock: FakeClock
) -> None:
    registry = Registry.create(config.namespace)
    w = Worker(config.namespace, 0, clock)
    registry.segment.words[control.HIGH_WATER // 8] = 0  # an older version kept none
    c = Controller.open(config, POLICY, clock=clock)
    try:
        assert set(c.workers) == {w.slot}
    finally:
        w.close()
        c.close()
        registry.close()
