"""A node whose /dev/shm fills up, run as a script inside a private tmpfs (`tiny_shm`): a
controller (`gearshift serve`) and a worker A with a ring; then a file fills /dev/shm; a worker
B (a process) finds no room for its ring; a worker C (a process, a small ring) registers a
profile on a new device, whose snapshot region finds no room; A keeps routing. Prints one JSON
object (exit statuses, events routed and consumed, what B and C were told); `role` b or c runs
one of those workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import gearshift as gs
from gearshift.controller import status
from gearshift.shm import Registry, SlotState

WAIT = 20.0
DIMS = {"SEQLEN": gs.Dim(max=4096)}
ROUTES, MORE = 100_000, 10_000  # by A before the fill (its ring wraps) and after it
B_ROUTES, B_RECORDED = 20_000, 1_000  # by B with no room for its ring, and once it has one
LEFT = 8 << 10  # bytes of /dev/shm the filler leaves: room for C's ring (2 pages), no more
FAST = ["--set", "slots=4", "--set", "scan_interval_seconds=0.05",
        "--set", "status_interval_seconds=0.05"]


def wait(condition: Callable[[], object]) -> bool:
    deadline = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def consumed(namespace: str) -> int:
    doc = status.read(namespace)
    return doc["events"]["consumed"] if doc else 0


def alive(namespace: str) -> bool:
    try:
        registry = Registry.attach(namespace)
    except gs.GearshiftError:
        return False
    try:
        return registry.controller().alive
    finally:
        registry.close()


def claimed(namespace: str) -> int:
    registry = Registry.attach(namespace)
    try:
        return sum(info.state != SlotState.FREE for info in registry.slots())
    finally:
        registry.close()


def fill() -> None:
    """Fill /dev/shm up to LEFT bytes, as another program would."""
    fs = os.statvfs("/dev/shm")
    with open(f"/dev/shm/filler.{time.monotonic_ns()}", "wb") as filler:
        filler.write(b"\1" * max(0, fs.f_bavail * fs.f_frsize - LEFT))


def route(prof: gs.Profile, count: int) -> None:
    for i in range(count):
        prof.route(SEQLEN=1 + i % 4000)


def worker_b(namespace: str) -> dict:
    """A worker of device 0 with no room for its ring: it serves, unrecorded; once the filler
    is gone it gets its ring at its next try and records."""
    gs.Client.retry_interval = 0.1
    with gs.connect(namespace) as client:
        prof = client.profile("prefill", DIMS)
        route(prof, B_ROUTES)
        found = {"slot": client.slot, "unrecorded": client.unrecorded}
        for name in os.listdir("/dev/shm"):
            if name.startswith("filler."):
                os.unlink(f"/dev/shm/{name}")
        found["attached"] = wait(lambda: client.slot is not None and prof.registered)
        route(prof, B_RECORDED)
        return found


def worker_c(namespace: str) -> dict:
    """A worker of device 1 (its ring fits): registering needs the device's snapshot region."""
    with gs.Client(namespace, 1, ring_capacity=64) as client:
        try:
            client.profile("prefill", DIMS)
        except gs.GearshiftError as e:
            return {"slot": client.slot, "refused": type(e).__name__, "message": str(e)}
        return {"slot": client.slot, "refused": None}


def child(role: str, namespace: str) -> dict:
    done = subprocess.run([sys.executable, __file__, role, namespace], capture_output=True,
                          text=True, timeout=60)
    found = json.loads(done.stdout) if done.returncode == 0 else {}
    return {**found, "exit": done.returncode, "log": done.stderr[-2000:]}


def main(namespace: str, state_dir: str) -> dict:
    serve = subprocess.Popen(
        [sys.executable, "-m", "gearshift", "serve", "-n", namespace, "--state-dir", state_dir,
         *FAST], stderr=subprocess.PIPE, text=True)
    try:
        assert wait(lambda: alive(namespace)), "the controller did not start"
        client = gs.connect(namespace, require_controller=True)
        prof = client.profile("prefill", DIMS)
        route(prof, ROUTES)
        assert wait(lambda: consumed(namespace) >= ROUTES), "A's events were not consumed"
        fill()
        b = child("b", namespace)
        assert wait(lambda: claimed(namespace) == 1), "B's slot was not reclaimed"
        fill()  # what B took is free again once its slot is reclaimed
        c = child("c", namespace)
        route(prof, MORE)
        all_consumed = wait(lambda: consumed(namespace) >= ROUTES + MORE + B_RECORDED)
        found = consumed(namespace)
        client.close()
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            _, log = serve.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            serve.kill()
            _, log = serve.communicate()
    warned = "less than 4 slots need" in log.split("\n", 1)[0]  # serve's start-up warning
    return {"serve_exit": serve.returncode, "serve_warned": warned, "serve_log": log[-4000:],
            "b": b, "c": c, "recorded": ROUTES + MORE + B_RECORDED, "consumed": found,
            "all_consumed": all_consumed}


if __name__ == "__main__":
    role, namespace = sys.argv[1], sys.argv[2]
    roles = {"b": worker_b, "c": worker_c}
    found = roles[role](namespace) if role in roles else main(namespace, sys.argv[3])
    print(json.dumps(found))
