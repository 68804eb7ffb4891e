"""Deployment faults, run for real: a full /dev/shm and a worker forked after `connect()`.

`full_shm` runs a node in a private mount namespace whose /dev/shm is a small tmpfs
(`private_shm`: `unshare`; None where none can be made): `gearshift serve`, a worker A that
routes until its ring wrapped, then a file fills /dev/shm; a worker B (a process) finds no room
for its ring, serves unrecorded, and gets its ring at a later try once the file is gone; a
worker C (a process, a small ring) registers a profile on a new device, whose snapshot region
finds no room: refused for now, C serves on the initial gears and registers once the file is
gone; A routes on. `forked` runs a worker that forks after
`connect(embedded=True)` (a pre-fork server's), in a real interpreter so that the child's exit
runs its atexit hooks: the child routes and exits; the parent's slot, state directory and events
must be untouched. Each returns its findings; `tally` adds both to a `gearshift stress --fuzz`
run, one row each: a nonzero exit is a crash, a recorded event never consumed is lost.

`python -m gearshift.tools.stress.faults ROLE ...` runs one process of them (one JSON line).
"""

from __future__ import annotations

import json
import mmap
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable

import gearshift as gs
from gearshift.controller import status
from gearshift.controller.footprint import footprint
from gearshift.shm import Registry, SlotState, cleanup, ring
from gearshift.tools.stress.target import WALL, Tally, serial
from gearshift.worker import Client, Profile

MODULE = "gearshift.tools.stress.faults"
WAIT = 20.0  # seconds: the bound of every wait
DIMS = {"SEQLEN": gs.Dim(max=4096)}
ROUTES, MORE = 100_000, 10_000  # by A before the fill (its ring wraps) and after it
B_ROUTES, B_RECORDED = 20_000, 1_000  # by B with no room for its ring, and once it has one
C_RING = 64  # worker C's ring capacity: what the filler leaves room for, in whole pages
LEFT = -(-(ring.RECORDS + C_RING * ring.RECORD) // mmap.PAGESIZE) * mmap.PAGESIZE
SLOTS = 4
BEFORE, CHILD, AFTER = 3000, 5000, 3000  # routed by a forking parent, its child, the parent
# (and by the parent meanwhile, as long as the child lives)
_MOUNT = 'mount -t tmpfs -o size="$0",mode=1777 tmpfs /dev/shm && exec "$@"'
_UNSHARE = (["unshare", "--mount", "--propagation", "private"],
            ["unshare", "--mount", "--propagation", "private", "--map-root-user"])


def private_shm(args: list[str], size: int,
                timeout: float = 120.0) -> subprocess.CompletedProcess[str] | None:
    """Run `args` in a private mount namespace whose /dev/shm is a fresh tmpfs of `size` bytes
    (gone with the namespace); None where no such namespace can be made."""
    for unshare in _UNSHARE:
        try:
            probe = subprocess.run([*unshare, "sh", "-c", _MOUNT, "64k", "true"],
                                   capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return subprocess.run([*unshare, "sh", "-c", _MOUNT, str(size), *args],
                                  capture_output=True, text=True, timeout=timeout)
    return None


def full_shm() -> dict | None:
    """The full /dev/shm node's findings (`node`), run in a private tmpfs sized for the
    controller, two workers and one device; None where none can be made."""
    namespace = f"faultshm{os.getpid()}x{next(serial)}"
    size = footprint(SLOTS).total(2, 1) + (256 << 10)
    with tempfile.TemporaryDirectory(prefix="gearshift-faults-") as state_dir:
        done = private_shm([sys.executable, "-m", MODULE, "node", namespace, state_dir], size)
    if done is None:
        return None
    found = _last_json(done.stdout)
    return {**found, "exit": done.returncode, "log": done.stderr[-2000:]}


def forked() -> dict:
    """The forked worker's findings (`forking_worker`)."""
    namespace = f"faultfork{os.getpid()}x{next(serial)}"
    try:
        done = subprocess.run([sys.executable, "-m", MODULE, "fork", namespace],
                              capture_output=True, text=True, timeout=90)
    finally:
        cleanup(namespace)
    return {**_last_json(done.stdout), "exit": done.returncode, "log": done.stderr[-2000:]}


def tally(tallies: dict[str, Tally]) -> None:
    """Add a row for each fault to a fuzz run's `tallies` (none for a full /dev/shm where no
    private mount namespace can be made)."""
    found = full_shm()
    if found is not None:
        t = tallies["full /dev/shm"] = Tally(cases=1)
        exits = {"node": found["exit"], "serve": found.get("serve_exit"),
                 "worker B": found.get("b", {}).get("exit"),
                 "worker C": found.get("c", {}).get("exit")}
        for who, code in exits.items():
            if code != 0:
                t.fail("crashes", f"{who}: exit {code}: {found['log'][-200:]}")
        c = found.get("c", {})
        if c.get("registered") or not c.get("registered_later"):
            t.fail("unserved", f"worker C was registered with no region, or never: {c}")
        _lost(t, found.get("recorded", 0), found.get("consumed", 0))
    found = forked()
    t = tallies["forked worker"] = Tally(cases=1)
    if found["exit"] != 0 or found.get("child_exit") != 0:
        t.fail("crashes", f"exit {found['exit']}, child {found.get('child_exit')}: "
                          f"{found['log'][-200:]}")
    if not (found.get("slot_intact") and found.get("state_dir_kept")):
        t.fail("crashes", f"the child's exit touched the parent's slot or state: {found}")
    _lost(t, found.get("recorded", 0), found.get("consumed", 0))


def _lost(t: Tally, recorded: int, consumed: int) -> None:
    if consumed != recorded:
        t.fail("lost", f"{recorded - consumed} of {recorded} recorded events not consumed")


def _last_json(out: str) -> dict:
    lines = out.strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        return {}


# the processes


def wait(condition: Callable[[], object], seconds: float = WAIT) -> bool:
    deadline = WALL.now() + seconds
    while not condition():
        if WALL.now() >= deadline:
            return False
        WALL.sleep(0.002)
    return True


def route(prof: Profile, count: int) -> None:
    for i in range(count):
        prof.route(SEQLEN=1 + i % 4000)


def _consumed(namespace: str) -> int:
    doc = status.read(namespace)
    return doc["events"]["consumed"] if doc else 0


def _claimed(namespace: str) -> int:
    """Slots claimed (-1: no live controller)."""
    try:
        registry = Registry.attach(namespace)
    except gs.GearshiftError:
        return -1
    try:
        if not registry.controller().alive:
            return -1
        return sum(info.state != SlotState.FREE for info in registry.slots())
    finally:
        registry.close()


def _fill() -> None:
    """Fill /dev/shm up to LEFT bytes, as another program would."""
    fs = os.statvfs("/dev/shm")
    with open(f"/dev/shm/filler.{WALL.now_ns()}", "wb") as filler:
        filler.write(b"\1" * max(0, fs.f_bavail * fs.f_frsize - LEFT))


def _unfill() -> None:
    for name in os.listdir("/dev/shm"):
        if name.startswith("filler."):
            os.unlink(f"/dev/shm/{name}")


def worker_b(namespace: str) -> dict:
    """A worker of device 0 with no room for its ring: it serves, unrecorded; once the filler
    is gone it gets its ring at its next try and records."""
    Client.retry_interval = 0.1
    with gs.connect(namespace) as client:
        prof = client.profile("prefill", DIMS)
        route(prof, B_ROUTES)
        found = {"slot": client.slot, "unrecorded": client.unrecorded}
        _unfill()
        found["attached"] = wait(lambda: client.slot is not None and prof.registered)
        route(prof, B_RECORDED)
        return found


def worker_c(namespace: str) -> dict:
    """A worker of device 1 (its ring fits): registering needs the device's snapshot region,
    which has no room; it serves on its initial gears, and registers at a later try once the
    filler is gone."""
    Client.retry_interval = 0.1
    with Client(namespace, 1, ring_capacity=C_RING) as client:
        prof = client.profile("prefill", DIMS)
        found = {"slot": client.slot, "registered": prof.registered, "routed": 0}
        found["routed"] = sum(prof.route(SEQLEN=64).gears["SEQLEN"] == 64 for _ in range(100))
        found["dropped"] = client.ring.dropped  # a ring of 64: the rest are counted, not lost
        _unfill()
        found["registered_later"] = wait(lambda: prof.registered and prof.version > 0)
        return found


def _child(role: str, namespace: str) -> dict:
    done = subprocess.run([sys.executable, "-m", MODULE, role, namespace],
                          capture_output=True, text=True, timeout=60)
    return {**_last_json(done.stdout), "exit": done.returncode, "log": done.stderr[-2000:]}


def node(namespace: str, state_dir: str) -> dict:
    """The full /dev/shm node (module docstring), inside its private tmpfs."""
    serve = subprocess.Popen(
        [sys.executable, "-m", "gearshift", "serve", "-n", namespace, "--state-dir", state_dir,
         "--set", f"slots={SLOTS}", "--set", "scan_interval_seconds=0.05",
         "--set", "status_interval_seconds=0.05"], stderr=subprocess.PIPE, text=True)
    found: dict = {}
    try:
        if wait(lambda: _claimed(namespace) >= 0):
            client = gs.connect(namespace, require_controller=True)
            prof = client.profile("prefill", DIMS)
            route(prof, ROUTES)
            wait(lambda: _consumed(namespace) >= ROUTES)
            _fill()
            found["b"] = _child("b", namespace)
            wait(lambda: _claimed(namespace) == 1)  # B's slot reclaimed: what it took is free
            _fill()
            found["c"] = _child("c", namespace)
            route(prof, MORE)
            c = found["c"]  # C's records (unregistered: consumed as `unknown`)
            recorded = ROUTES + MORE + B_RECORDED + c.get("routed", 0) - c.get("dropped", 0)
            found["all_consumed"] = wait(lambda: _consumed(namespace) >= recorded)
            found.update(recorded=recorded, consumed=_consumed(namespace))
            client.close()
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            _, log = serve.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
            _, log = serve.communicate()
    warned = f"less than {SLOTS} slots need" in log.split("\n", 1)[0]  # its start-up warning
    return {**found, "serve_exit": serve.returncode, "serve_warned": warned,
            "serve_log": log[-4000:]}


def forking_worker(namespace: str) -> dict:
    """A worker that routes, forks a child that exits at once, forks one that routes and
    exits while the parent routes too, then checks its slot and state directory, routes again
    and waits for its embedded controller to consume it all."""
    client = gs.connect(namespace, embedded=True)
    controller = client._embedded.controller  # the embedded Controller
    state_dir = getattr(client._embedded.scratch, "name", client._embedded.scratch)
    client.heartbeat_interval = 3600.0  # beyond its first beat it beats only as it adopts
    prof = client.profile("prefill", DIMS)
    route(prof, BEFORE)
    wait(lambda: client.registry.slots()[client.slot].heartbeat_ns != 0)
    row = client.registry.slots()[client.slot]
    idle = os.fork()
    if idle == 0:  # a child that never records (a data loader's) exits: it took nothing
        sys.exit(0)
    os.waitpid(idle, 0)
    claimed = sum(info.state != SlotState.FREE for info in client.registry.slots())
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its exit (sys.exit) runs the atexit hooks it inherited
        os.close(read)
        route(prof, 1)  # its first use
        ok = wait(lambda: client.slot is not None and prof.registered)
        route(prof, CHILD)
        report = {"slot": client.slot, "unrecorded": client.unrecorded, "registered": ok}
        os.write(write, json.dumps(report).encode())
        sys.exit(0 if ok else 1)
    os.close(write)
    exited, during, deadline = [], 0, WALL.now() + WAIT
    while not exited and WALL.now() < deadline:  # the parent routes all the while the child does
        route(prof, 100)
        during += 100
        WALL.sleep(0.001)  # ~100,000 a second: its ring (65,536) never fills
        done, word = os.waitpid(pid, os.WNOHANG)
        exited.extend([word] if done else [])
    if not exited:
        os.kill(pid, signal.SIGKILL)
        exited.append(os.waitpid(pid, 0)[1])
    report = json.loads(os.read(read, 4096) or b"{}")
    after = client.registry.slots()[client.slot]
    state_kept = os.path.isdir(state_dir)
    route(prof, AFTER)
    recorded = BEFORE + during + AFTER + CHILD + 1 - report.get("unrecorded", CHILD + 1)
    all_consumed = wait(lambda: controller.batch.counts["consumed"] >= recorded, 10.0)
    counts = dict(controller.batch.counts)
    client.close()
    return {
        "child_exit": os.waitstatus_to_exitcode(exited[0]),
        "child": report, "parent_slot": client.slot, "state_dir_kept": state_kept,
        "claimed_after_idle_child": claimed, "routed_by_parent_meanwhile": during,
        # state, identity, generation and drops as they were; the heartbeat and the applied
        # version only move forward (the parent may adopt a snapshot meanwhile, which beats)
        "slot_intact": after._replace(heartbeat_ns=row.heartbeat_ns,
                                      applied_version=row.applied_version) == row
        and after.heartbeat_ns >= row.heartbeat_ns
        and after.applied_version >= row.applied_version,
        "row_before": list(row), "row_after": list(after),
        "recorded": recorded, "consumed": counts["consumed"], "unknown": counts["unknown"],
        "all_consumed": all_consumed, "dropped": after.dropped,
        "state_dir_removed_at_close": not os.path.exists(state_dir),
    }


if __name__ == "__main__":
    role, args = sys.argv[1], sys.argv[2:]
    roles = {"b": worker_b, "c": worker_c, "node": node, "fork": forking_worker}
    print(json.dumps(roles[role](*args)))
