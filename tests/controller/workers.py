"""A minimal worker made of the shm primitives (claim a slot, create its ring, register over
the mailbox, put events, read snapshots, ack), for the controller's tests; run as a script it
is a worker process that registers, puts events and then waits to be killed."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from gearshift import protocol
from gearshift.clock import Clock, MonotonicClock
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim
from gearshift.shm import EventRing, Registry, SnapshotRegion, mailbox

WAIT = 20.0  # seconds: the bound of every wait
DIMS = {"B": Dim(gears=[1, 2, 4, 8, 16, 32, 64], max=64)}
POLICY = PolicyConfig(  # short windows and intervals: the controller tests' policy
    window_seconds=60.0,
    half_life_seconds=30.0,
    slice_seconds=5.0,
    update_interval_seconds=10.0,
    check_interval_seconds=1.0,
    recent_use_protect_seconds=5.0,
)


class Worker:
    def __init__(
        self, namespace: str, device: int = 0, clock: Clock | None = None, capacity: int = 1 << 12
    ) -> None:
        self.namespace, self.device = namespace, device
        self.clock = clock or MonotonicClock()
        self.registry = Registry.attach(namespace)
        self.slot = self.registry.claim_slot(device)
        self.ring = EventRing.create(namespace, self.slot, capacity)
        self.region: SnapshotRegion | None = None
        self.applied = 0

    def register(
        self,
        profile: int,
        name: str,
        dims: dict[str, Dim] = DIMS,
        serve: Callable[[], None] = lambda: time.sleep(0.005),
    ) -> dict:
        """Register and wait for the reply, calling `serve()` while waiting (an in-process
        controller's step, or a short sleep); raises the reply's typed error."""
        assert self.registry.requests(self.slot).post(
            protocol.register_message(profile, name, dims)
        )
        deadline = time.monotonic() + WAIT
        while (reply := self.registry.replies(self.slot).take()) is None:
            assert time.monotonic() < deadline, "no registration reply"
            serve()
        return mailbox.raise_for_error(reply)

    def put(self, profile: int, *values: int, t: float | None = None) -> bool:
        t = self.clock.now() if t is None else t
        return self.ring.put(round(t * 1e9), profile, self.applied, values, (1,) * len(values))

    def snapshot(self) -> tuple[int, object] | None:
        """(version, payload) of the device's snapshot, acknowledged; None before the first."""
        if self.region is None:
            try:
                self.region = SnapshotRegion.attach(self.namespace, self.device)
            except FileNotFoundError:
                return None
        snap = self.region.read()
        if snap is None:
            return None
        self.applied = snap.version
        self.registry.beat(
            self.slot, round(self.clock.now() * 1e9), self.applied, self.ring.dropped
        )
        return snap.version, snap.payload

    def gears(self, name: str) -> dict[str, tuple[int, ...]] | None:
        snap = self.snapshot()
        return protocol.profile_gears(snap[1], name) if snap else None

    def close(self) -> None:
        """Detach (idempotent): the ring stays for the controller's final drain."""
        if self.ring.segment.mm.closed:
            return
        self.ring.close()
        if self.region is not None:
            self.region.close()
        self.registry.release_slot(self.slot)
        self.registry.close()


if __name__ == "__main__":  # NS DEVICE EVENTS: register "decode" as id 0, put, wait to be killed
    namespace, device, events = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    worker = Worker(namespace, device)
    worker.register(0, "decode")
    for _ in range(events):
        worker.put(0, 40)
    print("ready", worker.slot, flush=True)
    time.sleep(WAIT)
