"""Bodies of the children `isolated.Isolated` runs in pid namespaces of their own. Each prints
what it did on stdout (one line each) and obeys one-line commands on stdin; stdin's end, or the
WAIT bound, ends it."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator

WAIT = 30.0


def _commands() -> Iterator[str]:
    deadline = time.monotonic() + WAIT
    for line in sys.stdin:
        yield line.strip()
        if time.monotonic() > deadline:
            return


def _say(*words: object) -> None:
    print(*words, flush=True)


def beating_slot(namespace: str, device: int = 0, events: int = 0, beat: bool = True) -> None:
    """A raw worker: claim a slot, create its ring (with `events` records), beat every 0.1 s
    (`beat`; else only the process's lease thread renews it) until "release" (release the slot
    and exit) or "die" (exit holding it)."""
    from gearshift.shm import EventRing, Registry

    registry = Registry.attach(namespace)
    slot = registry.claim_slot(device=device)
    ring = EventRing.create(namespace, slot, 64)
    for seq in range(events):
        ring.put(time.monotonic_ns(), 0, 0, (seq + 1,), (1,))
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            registry.beat(slot, time.monotonic_ns(), 0, 0)
            stop.wait(0.1)

    if beat:
        threading.Thread(target=beat, daemon=True).start()
    _say("claimed", slot, os.getpid())
    for command in _commands():
        if command == "release":
            stop.set()
            registry.release_slot(slot)
            ring.close()
            _say("released")
            return
        if command == "die":
            os._exit(0)


def client(namespace: str) -> None:
    """A real worker (`gs.connect`): one profile, routing on "route N"; "close" closes it
    (its `leave` runs) and exits; reports "attached SLOT" once attached. It does not wait for
    the profile's registration (the tests' controllers may never answer it)."""
    import gearshift as gs

    with gs.connect(namespace, register_timeout=0) as c:
        prof = c.profile("prefill", {"SEQLEN": gs.Dim(max=4096)})
        deadline = time.monotonic() + WAIT
        while c.slot is None and time.monotonic() < deadline:
            time.sleep(0.01)
        _say("attached", c.slot)
        for command in _commands():
            if command.startswith("route"):
                for i in range(int(command.split()[1])):
                    prof.route(SEQLEN=1 + i % 4000)
                _say("routed")
            elif command == "close":
                break
    _say("closed")


def locker(namespace: str, hold: float) -> None:
    """Take the namespace lock (recorded), hold it `hold` seconds alive, release it; on
    "die" while holding (hold < 0: hold until a command), exit holding it."""
    from gearshift.shm import Registry

    registry = Registry.attach(namespace)
    held = registry.lock.held()
    held.__enter__()
    _say("held")
    if hold >= 0:
        time.sleep(hold)
        held.__exit__(None, None, None)
        _say("released")
        return
    for command in _commands():
        if command == "die":
            os._exit(0)


def controller_word(namespace: str) -> None:
    """Claim the controller word and beat it every 0.05 s until "die" (exit as controller)."""
    from gearshift.shm import Registry

    registry = Registry.attach(namespace)
    registry.claim_controller()
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            registry.beat_controller(time.monotonic_ns())
            stop.wait(0.05)

    threading.Thread(target=beat, daemon=True).start()
    _say("controller", os.getpid())
    for command in _commands():
        if command == "die":
            os._exit(0)
