"""A worker that forks after `connect(embedded=True)`, run as a script (a real interpreter, so
the child's exit runs its atexit hooks as a pre-fork server's worker's would): the parent routes,
forks, the child routes and exits, the parent checks its slot and state directory and routes
again, then waits for its embedded controller to consume every recorded event. Prints one JSON
object; exits 0 unless a wait ran out."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

import gearshift as gs

WAIT = 20.0  # seconds: the bound of every wait
DIMS = {"SEQLEN": gs.Dim(max=4096)}
BEFORE, CHILD, AFTER = 3000, 5000, 3000  # requests routed by the parent, the child, the parent


def wait(condition: Callable[[], object], seconds: float = WAIT) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.002)
    return True


def route(prof: gs.Profile, count: int) -> None:
    for i in range(count):
        prof.route(SEQLEN=1 + i % 4000)


def child(client: gs.Client, prof: gs.Profile, out: int) -> int:
    """Route once (the first use), wait for a slot and registration of its own, route CHILD."""
    route(prof, 1)
    ok = wait(lambda: client.slot is not None and prof.registered)
    route(prof, CHILD)
    report = {"slot": client.slot, "unrecorded": client.unrecorded, "registered": ok}
    os.write(out, json.dumps(report).encode())
    return 0 if ok else 1


def main(namespace: str) -> int:
    client = gs.connect(namespace, embedded=True)
    controller = client._embedded.controller.controller  # the embedded Controller
    state_dir = getattr(client._embedded.scratch, "name", client._embedded.scratch)
    client.heartbeat_interval = 3600.0  # after its first beat the slot's words stay put
    prof = client.profile("prefill", DIMS)
    route(prof, BEFORE)
    wait(lambda: client.registry.slots()[client.slot].heartbeat_ns != 0)
    row = client.registry.slots()[client.slot]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its exit (sys.exit) runs the inherited atexit hooks
        os.close(read)
        sys.exit(child(client, prof, write))
    os.close(write)
    deadline, status = time.monotonic() + WAIT, None
    while status is None and time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        status = status if done else None
        time.sleep(0.01)
    if status is None:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    report = json.loads(os.read(read, 4096) or b"{}")
    after = client.registry.slots()[client.slot]
    intact = after == row  # state, identity, generation, heartbeat, applied version, dropped
    state_kept = os.path.isdir(state_dir)
    route(prof, AFTER)
    recorded = BEFORE + AFTER + CHILD + 1 - report.get("unrecorded", CHILD + 1)
    consumed = wait(lambda: controller.batch.counts["consumed"] >= recorded, 10.0)
    counts = dict(controller.batch.counts)
    client.close()
    print(json.dumps({
        "child_exit": os.waitstatus_to_exitcode(status) if status is not None else None,
        "child": report, "parent_slot": client.slot, "slot_intact": intact,
        "state_dir_kept": state_kept,
        "recorded": recorded, "consumed": counts["consumed"], "unknown": counts["unknown"],
        "all_consumed": consumed, "dropped": after.dropped,
        "state_dir_removed_at_close": not os.path.exists(state_dir),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
