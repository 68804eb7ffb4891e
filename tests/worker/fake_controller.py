"""A tiny controller made of the shm primitives, for the client's tests, and the bodies of the
child processes that run one (importable by multiprocessing's forkserver).

It claims the namespace, answers registrations (ProfileMismatch for a known name with other
dims), publishes snapshots on demand and drains rings; it decides nothing.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from gearshift import protocol
from gearshift.clock import FakeClock
from gearshift.core.dims import Dim
from gearshift.errors import GearshiftError, NamespaceBusy, ProfileMismatch
from gearshift.shm import EventRing, Registry, SlotState, SnapshotRegion, error_reply

WAIT = 20.0  # seconds: the bound of every wait in a child


class FakeController:
    def __init__(self, namespace: str, device: int = 0, create: bool = True) -> None:
        self.namespace, self.device = namespace, device
        self.registry = (Registry.create if create else Registry.attach)(namespace)
        self.registry.repair_lock()  # as a controller starts: its killed predecessor may hold it
        self.registry.claim_controller()
        try:
            self.region = SnapshotRegion.create(namespace, device)
        except NamespaceBusy:
            self.region = SnapshotRegion.attach(namespace, device)
        self.known: dict[str, dict[str, Dim]] = {}
        self.registered: list[tuple[int, int, str]] = []  # (slot, profile id, name)
        self.gears: dict[str, dict[str, Sequence[int]]] = {}  # what publish() sends
        self.publish_on_register = False

    def serve(self) -> int:
        """Answer every waiting registration; returns how many."""
        answered = 0
        for info in self.registry.slots():
            if info.state != SlotState.ACTIVE:
                continue
            message = self.registry.requests(info.slot).take()
            if message is None:
                continue
            pid, name, dims = protocol.parse_register(message)
            if self.known.setdefault(name, dims) != dims:
                reply = error_reply(ProfileMismatch(f"{name!r} is registered with other dims"))
            else:
                self.registered.append((info.slot, pid, name))
                if self.publish_on_register and name not in self.gears:
                    initial = {d: s.initial_gears for d, s in dims.items()}
                    self.publish({**self.gears, name: initial})
                reply = {"op": "registered", "profile": pid, "version": self.region.version()}
            assert self.registry.replies(info.slot).post(reply)
            answered += 1
        return answered

    def publish(self, gears: Mapping[str, Mapping[str, Sequence[int]]]) -> int:
        self.gears = {p: dict(g) for p, g in gears.items()}
        return self.region.publish(protocol.snapshot_payload(self.device, self.gears))

    def drain(self, slot: int) -> np.ndarray:
        ring = EventRing.attach(self.namespace, slot)
        try:
            return ring.drain()
        finally:
            ring.close()

    def close(self) -> None:
        """Reclaim the workers' slots (draining and unlinking their rings), unlink the rest."""
        self.registry.release_controller()
        for info in self.registry.slots():
            if info.reclaimable:
                ring = EventRing.attach(self.namespace, info.slot)
                ring.drain()
                self.registry.reclaim(info.slot, ring)
                ring.close()
        self.region.unlink()
        self.region.close()
        self.registry.unlink()
        self.registry.close()


class ServingClock(FakeClock):
    """Virtual time in which a controller answers whenever the client waits: `serve` runs on
    every `sleep` (FakeController.serve, or a real Controller.step)."""

    def __init__(self, serve: Callable[[], object], start: float = 0.0) -> None:
        super().__init__(start)
        self.serve = serve

    def sleep(self, seconds: float) -> None:
        self.serve()
        super().sleep(seconds)


def wait_until(condition: Callable[[], object], step: Callable[[], None] = lambda: None) -> None:
    """Run `step` until `condition()` holds; fail after WAIT seconds (a bound, not a timing)."""
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        step()
        time.sleep(0.001)


# -- child process bodies --


def serve(namespace: str, create: bool, gears: dict, ready, results, stop) -> None:
    """Be the controller: publish `gears`, set `ready`, answer registrations (reporting each to
    `results`) until `stop` or until killed; exit without releasing the controller."""
    fake = FakeController(namespace, create=create)
    fake.publish_on_register = True
    if gears:
        fake.publish(gears)
    ready.set()
    deadline = time.monotonic() + WAIT
    reported = 0
    while not stop.is_set() and time.monotonic() < deadline:
        with contextlib.suppress(GearshiftError):
            fake.serve()
        for registration in fake.registered[reported:]:
            results.put(registration)
        reported = len(fake.registered)
        time.sleep(0.001)
