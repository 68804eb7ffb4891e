"""A tiny controller made of the shm primitives, for the client's tests, and the bodies of the
child processes that run one (importable by multiprocessing's forkserver).

It claims the namespace, answers registrations with the controller's own checks
(`controller.registrations.admit`, this class being its Registrar: ProfileMismatch for a known
name with other dims; `take`, `post` and `failure` as the controller's), publishes snapshots on
demand and drains rings; it decides nothing.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from fakeclock import FakeClock

from gearshift import protocol
from gearshift.controller import registrations
from gearshift.controller.effects import Reply
from gearshift.core.dims import Dim
from gearshift.errors import GearshiftError, NamespaceBusy
from gearshift.shm import EventRing, Registry, SlotState, SnapshotRegion

WAIT = 20.0  # seconds: the bound of every wait in a child
log = logging.getLogger(__name__)


def answer(registrar: Any, slot: int, message: Mapping[str, Any], now: float) -> dict:
    """The reply to `slot`'s registration: admitted as the controller does
    (`registrations.admit`), then recorded by `registrar.register` (its version); or the
    refusal (`registrations.failure`)."""
    try:
        request, _, _, new = registrations.admit(registrar, slot, message, now)
        version = registrar.register(slot, request, new, now)
    except Exception as e:
        return registrations.failure(slot, e, now)
    return {"op": "registered", "profile": request.local, "version": version}


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
        self.known: dict[str, dict[str, Dim]] = {}  # every device's profiles, never forgotten
        self.holders: dict[str, int] = {}  # name -> pid of its first registrant
        self.registered: list[tuple[int, int, str]] = []  # (slot, profile id, name)
        self.gears: dict[str, dict[str, Sequence[int]]] = {}  # what publish() sends
        self.publish_on_register = False

    def serve(self) -> int:
        """Answer every waiting registration, each slot's on its own (a failure is logged);
        returns how many."""
        now, answered = time.monotonic(), 0
        for slot in range(self.registry.high_water()):
            try:
                taken = registrations.take(self.registry, slot, now)
                if taken is None:
                    continue
                reply = taken.message if isinstance(taken, Reply) else answer(self, slot, taken,
                                                                              now)
                registrations.post(self.registry, slot, reply, now)
                answered += 1
            except Exception as e:
                log.warning("registration of slot %d failed: %s: %s", slot, type(e).__name__, e)
        return answered

    # -- the Registrar of `registrations.admit` --

    def claimant(self, slot: int, now: float) -> tuple[int, int]:
        info = self.registry.slots()[slot]
        if info.state != SlotState.ACTIVE:
            raise NamespaceBusy(f"slot {slot} is not held by a worker")
        return info.device, info.pid

    def dims_of(self, device: int, name: str) -> Mapping[str, Dim] | None:
        return self.known.get(name)

    def holder(self, device: int, name: str, slot: int) -> int | None:
        """A known name is always held: by its first registrant, or pid 0 if a test set it."""
        return self.holders.get(name, 0)

    def register(self, slot: int, request: registrations.Request, new: bool, now: float) -> int:
        name, dims = request.name, request.dims
        if new:
            self.known[name] = dims
            self.holders[name] = self.registry.slots()[slot].pid
        self.registered.append((slot, request.local, name))
        if self.publish_on_register and name not in self.gears:
            self.publish({**self.gears, name: {d: s.initial_gears for d, s in dims.items()}})
        return self.region.version()

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
                try:
                    ring = EventRing.attach(self.namespace, info.slot)
                except FileNotFoundError:  # its worker never made one (no room for it)
                    self.registry.reclaim(info.slot, None)
                    continue
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
