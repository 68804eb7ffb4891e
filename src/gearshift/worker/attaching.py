"""How a worker's `Client` (session.py) attaches its namespace, follows its controller, and
re-attaches when what it mapped is gone.

`_attach` claims a slot and creates its ring once a controller has created the namespace (no
room in /dev/shm: tried again every `retry_interval`); `_watch_controller` registers every
profile again when another controller takes over and warns (rate-limited) while none lives;
`_attach_region` maps the device's snapshot region. `_lost`, asked with every heartbeat, says
whether the control segment or the ring still stand under their names (same inode) and the slot
is still this process's claim; if not, `_reattach` does the reset a fork does (every handle
dropped, records counted unrecorded meanwhile), closes the old mappings and attaches anew:
within a heartbeat interval of a namespace removed (RemoveIPC, an operator's rm) and re-created
by a restarted controller, or of its slot reclaimed after a stop longer than the lease.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from gearshift.clock import Clock
from gearshift.errors import (
    ControllerNotFound,
    GearshiftError,
    NamespaceBusy,
    NotOwned,
    SpaceError,
)
from gearshift.shm import EventRing, Registry, SnapshotRegion, lease
from gearshift.shm.lease import Watch
from gearshift.worker import lifecycle
from gearshift.worker.standins import NoSnapshot, Unrecorded

if TYPE_CHECKING:
    from gearshift.worker.profile import Profile
    from gearshift.worker.registration import RegistrationQueue

log = logging.getLogger(__name__)
NO_CONTROLLER = "no controller is running on namespace %r (start one with `gearshift serve -n %s`)"


class Attaching:
    """The attaching half of `session.Client` (its attributes, set by its constructor)."""

    namespace: str
    device: int
    clock: Clock
    registry: Registry | None
    slot: int | None
    ring: EventRing | Unrecorded
    region: SnapshotRegion | NoSnapshot
    retry_interval: float
    _unrecorded: Unrecorded
    _profiles: dict[str, Profile]
    _registrations: RegistrationQueue
    _life: lifecycle.Machine
    _leader: int
    _no_room: bool
    _retry_at: float
    _region_stale: bool
    _ring_capacity: int
    _seen: int
    _watch: Watch  # this client's observations of leases, kept across its registries

    def _warn(self, message: str, *args: Any) -> None: ...  # session.Client's
    def _forked(self, restart: bool = True) -> None: ...

    @property
    def unrecorded(self) -> int: ...

    def _attach(self, strict: bool, given: Registry | None = None) -> None:
        """Attach the namespace (`given`: attached already; its caller closes it if this raises)
        if a controller has created it (`_bind`). No room for the ring: a try `retry_interval`
        later; every slot held (or the lock busy): serving unrecorded, a try every lease.BEAT.
        Another failure raises if `strict` (the constructor), else the next tick tries."""
        now = self.clock.now()
        if given is not None:
            registry = given
        elif now < self._retry_at:
            return
        else:
            try:
                registry = Registry.attach(self.namespace)
            except ControllerNotFound:  # no control segment yet, or one being cleaned up
                return
            except (GearshiftError, OSError) as e:
                if strict:
                    raise
                self._warn("namespace %r: cannot attach its control segment: %s", self.namespace, e)
                return
        registry.watch, registry.clock = self._watch, self.clock  # leases watched across
        try:  # tries (a dead slot of another pid namespace: reusable once its lease expired)
            self._bind(registry)
        except SpaceError as e:
            registry.close()
            self._retry_at = now + self.retry_interval
            if not self._no_room:
                log.warning("namespace %r: %s; serving unrecorded, trying again every %g s",
                            self.namespace, e, self.retry_interval)
            self._no_room = True
        except (GearshiftError, OSError) as e:
            if given is not None:
                raise
            registry.close()
            if isinstance(e, ControllerNotFound):  # cleaned up meanwhile: the next controller
                return  # creates it anew
            busy = isinstance(e, NamespaceBusy) and not isinstance(e, NotOwned)
            if strict and not busy:  # every slot held, or the lock: tried again, unrecorded
                raise
            self._retry_at = now + lease.BEAT
            self._warn("namespace %r: cannot claim a worker slot: %s; serving unrecorded, "
                       "trying again", self.namespace, e)
        else:
            if not strict or self._no_room:
                self._no_room = False
                log.info("namespace %r: attached as slot %d; %d requests before were not "
                         "recorded", self.namespace, self.slot, self.unrecorded)

    def _bind(self, registry: Registry) -> None:
        """Claim a slot of `registry`, create its ring, record and register through it."""
        slot = registry.claim_slot(self.device)
        try:
            ring = EventRing.create(self.namespace, slot, self._ring_capacity)
        except BaseException:
            registry.release_slot(slot)
            raise
        self._leader = registry.controller().pid
        self.slot, self.ring = slot, ring
        self._unrecorded.forward(ring.write)
        for prof in self._profiles.values():  # made before the ring: straight to it now
            prof._rebind(ring.write)
        self._registrations.bind(registry, slot)
        self.registry = registry  # last: the swap thread's sign that the client is attached
        self._life.advance("attach")

    def _watch_controller(self) -> None:
        registry = self.registry
        if registry is None:
            if self._no_room:  # a controller runs: _attach said why there is no ring
                return
            self._warn(NO_CONTROLLER + ": serving on the initial gears, unrecorded, until one "
                       "starts", self.namespace, self.namespace)
            return
        info = registry.controller()
        if not info.alive:
            self._warn("namespace %r has no live controller: serving on snapshot v%d (start one "
                       "with `gearshift serve -n %s`)", self.namespace, self._seen, self.namespace)
        elif info.pid != self._leader:
            log.info("namespace %r: controller pid %d took over from pid %d; registering again",
                     self.namespace, info.pid, self._leader)
            self._leader, self._region_stale = info.pid, True
            self._registrations.again()
            self._life.advance("new controller")

    def _attach_region(self) -> None:
        if self.registry is None:  # a region without a control segment is a leftover
            return
        try:
            region = SnapshotRegion.attach(self.namespace, self.device)
        except FileNotFoundError:
            return
        except GearshiftError as e:
            self._warn("namespace %r: snapshot region of device %d: %s", self.namespace,
                       self.device, e)
            return
        self.region, self._region_stale = region, False  # the old mapping goes with its last use

    def _lost(self, registry: Registry, slot: int, ring: EventRing) -> str | None:
        """Why the namespace this client mapped is no longer the one its names stand for (None:
        it is): its control segment or ring removed or replaced (an operator's rm, RemoveIPC, a
        cleanup, a new namespace), or its slot reclaimed (judged dead: stopped past the lease)."""
        if registry.segment.displaced():
            return "its control segment was removed or replaced"
        if not registry.holds(slot):
            return f"slot {slot} is no longer its own (reclaimed)"
        if ring.segment.displaced():
            return f"the ring of slot {slot} was removed or replaced"
        return None

    def _reattach(self, reason: str) -> None:
        """The swap thread's reset when `_lost` says why: the fork's reset (`_forked`, every
        handle dropped, records counted unrecorded meanwhile), the old mappings closed, then
        attached again at once if a namespace is there (else at a later tick), every profile
        registered again."""
        log.warning("namespace %r: %s; attaching again and registering every profile again",
                    self.namespace, reason)
        registry, ring = self.registry, self.ring
        self._forked(restart=False)
        self._no_room, self._region_stale = False, True
        if isinstance(ring, EventRing):
            ring.close()  # a request thread's write in flight sees a closed ring: a no-op
        if registry is not None:
            registry.close()
        self._attach(strict=False)

