"""A worker's claim when no slot is FREE: a released or dead slot reused without a controller.

A slot is `reclaimable` (slotinfo.py) once its worker released it or was judged dead (lease.py).
Its ring may still hold events: a live controller drains it and frees the slot, so a claimer
leaves such a slot to it; without one (a controller down is no reason to refuse workers) the
claimer unlinks the ring and counts what it held in the control segment's `discarded` word.
An empty ring, or none, is unlinked (if ours) and the slot reused at once. Runs under the lock.
"""

from __future__ import annotations

from typing import Protocol

from gearshift.clock import Clock
from gearshift.errors import GearshiftError, NotOwned
from gearshift.shm import names, segment
from gearshift.shm.lease import Watch
from gearshift.shm.ring import EventRing
from gearshift.shm.slotinfo import ControllerInfo, judge


class Table(Protocol):
    """What `reusable` reads and writes of a `control.Registry`."""

    namespace: str
    nslots: int
    watch: Watch
    clock: Clock

    def row(self, slot: int) -> tuple[int, ...]: ...
    def controller(self) -> ControllerInfo: ...
    def add_discarded(self, events: int) -> None: ...

def reusable(registry: Table) -> int | None:
    """Under the lock: the lowest released or dead slot whose ring is gone, empty, or (no
    live controller would drain it) holding events, which are counted in `discarded`;
    its ring unlinked. None if there is none."""
    now, drained_by_controller = registry.clock.now(), None
    for slot in range(registry.nslots):
        if not judge(slot, registry.row(slot), registry.watch, now).reclaimable:
            continue
        name = names.ring(registry.namespace, slot)
        try:
            ring = EventRing.attach(registry.namespace, slot, timeout=0.0)
        except FileNotFoundError:
            return slot
        except GearshiftError:  # unsealed, garbage or another user's: ours goes
            try:
                segment.unlink(name)
            except (NotOwned, OSError):
                continue
            return slot
        try:
            pending = ring.pending()
            if pending:
                if drained_by_controller is None:
                    drained_by_controller = registry.controller().alive
                if drained_by_controller:
                    continue  # the controller drains and frees it
            ring.unlink()
        finally:
            ring.close()
        registry.add_discarded(pending)
        return slot
    return None

