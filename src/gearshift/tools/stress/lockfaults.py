"""Deployment faults of the namespace lock, run for real: a participant stopped (SIGSTOP) while
holding the lock, then killed holding it.

`lock_holder` runs `gearshift serve` and a worker (this process, the real client) routing
flat out; a holder process takes the namespace lock and stops. While it is stopped the
controller's heartbeat is sampled (its longest gap is the loop's longest stall) and the worker
routes on; then the holder is killed, still holding the lock, which the controller must release
within a second; the worker routes again, and `gearshift stop` ends the controller, which must
exit 0 without a traceback. `tally` adds its row to a `gearshift stress --fuzz` run.

`python -m gearshift.tools.stress.lockfaults hold NAMESPACE` is the holder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import gearshift as gs
from gearshift.shm import Registry, cleanup
from gearshift.tools.stress.faults import DIMS, _claimed, _consumed, route, wait
from gearshift.tools.stress.target import WALL, Tally, serial

MODULE = "gearshift.tools.stress.lockfaults"
STOPPED_SECONDS = 1.0  # how long the holder stays stopped
STALL = 0.1  # seconds: the longest the loop may go without a beat
REPAIR = 1.0  # seconds: a dead holder's lock is released within this
WAIT_KILL = 10.0  # seconds: the killed holder is reaped within this


def lock_holder() -> dict:
    """The findings of a stopped, then dead, lock holder beside a live node."""
    namespace = f"faultlock{os.getpid()}x{next(serial)}"
    found: dict = {}
    with tempfile.TemporaryDirectory(prefix="gearshift-faults-") as state_dir:
        serve = subprocess.Popen(
            [sys.executable, "-m", "gearshift", "serve", "-n", namespace, "--state-dir",
             state_dir, "--set", "status_interval_seconds=0.05"],
            stderr=subprocess.PIPE, text=True)
        try:
            if wait(lambda: _claimed(namespace) >= 0):
                found = _run(namespace)
            found["stop_exit"] = subprocess.run(
                [sys.executable, "-m", "gearshift", "stop", "-n", namespace],
                capture_output=True, timeout=60).returncode
        finally:
            try:
                _, log = serve.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                serve.kill()
                _, log = serve.communicate()
            cleanup(namespace)
    return {**found, "serve_exit": serve.returncode, "traceback": "Traceback" in log,
            "log": log[-2000:]}


def _run(namespace: str) -> dict:
    client = gs.connect(namespace, require_controller=True)
    registry = Registry.attach(namespace)
    prof = client.profile("prefill", DIMS)
    holder = subprocess.Popen([sys.executable, "-m", MODULE, "hold", namespace])
    try:
        wait(lambda: _state(holder.pid) == "T")
        beat, seen, stall, routed = registry.controller().heartbeat_ns, WALL.now(), 0.0, 0
        end = seen + STOPPED_SECONDS
        while WALL.now() < end:
            route(prof, 50)
            routed += 50
            now, latest = WALL.now(), registry.controller().heartbeat_ns
            if latest != beat:
                beat, seen = latest, now
            stall = max(stall, now - seen)
        held = registry.lock.value == 0
    finally:
        holder.kill()  # dies holding the lock
        holder.wait(WAIT_KILL)
    killed = WALL.now()
    repaired = wait(lambda: registry.lock.value == 1, 5.0)
    repair_seconds = WALL.now() - killed
    route(prof, 1000)
    routed += 1000
    recorded = routed - client.ring.dropped - client.unrecorded
    wait(lambda: _consumed(namespace) >= recorded, 10.0)
    found = {"held_while_stopped": held, "stall_seconds": stall, "repaired": repaired,
             "repair_seconds": repair_seconds, "routed": routed, "recorded": recorded,
             "consumed": _consumed(namespace), "dropped": client.ring.dropped}
    client.close()
    registry.close()
    return found



def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return ""
    return stat[stat.rindex(b")") + 2 :].split()[0].decode()


def hold(namespace: str) -> None:
    """Take the namespace lock and stop holding it (until killed)."""
    registry = Registry.attach(namespace)
    with registry.lock.held():
        os.kill(os.getpid(), signal.SIGSTOP)
        WALL.sleep(60.0)


def tally(tallies: dict[str, Tally]) -> None:
    """Add the row "stopped, then dead lock holder" to a fuzz run's `tallies`."""
    found = lock_holder()
    t = tallies["stopped, then dead lock holder"] = Tally(cases=1)
    if found.get("serve_exit") != 0 or found.get("stop_exit") != 0 or found.get("traceback"):
        t.fail("crashes", f"serve exit {found.get('serve_exit')}, stop exit "
                          f"{found.get('stop_exit')}: {found['log'][-200:]}")
    if not found.get("held_while_stopped"):
        t.fail("crashes", "the stopped holder's lock was taken from it")
    if found.get("stall_seconds", 0.0) > STALL:
        t.fail("stalls", f"the loop went {found['stall_seconds']:.3f} s without a beat")
    if not found.get("repaired") or found.get("repair_seconds", 0.0) > REPAIR:
        t.fail("crashes", f"the dead holder's lock was not released within {REPAIR} s: {found}")
    if found.get("consumed", 0) < found.get("recorded", 0):
        t.fail("lost", f"{found['recorded'] - found['consumed']} of {found['recorded']} "
                       "recorded events not consumed")


if __name__ == "__main__":
    hold(sys.argv[2])
