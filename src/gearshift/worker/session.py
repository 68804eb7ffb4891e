"""A worker's session with its node's controller: `Client` (made by `connect`).

A client attaches its namespace (claims a worker slot for its device, creates the slot's event
ring), attaches the device's snapshot region once the controller has created it, and registers
each `profile` through the slot's mailbox (`RegistrationQueue`; with a live controller the
caller waits `register_timeout` for the reply: a refusal, ProfileMismatch, is raised to it; no
reply: the profile serves on its initial gears and registers when the controller answers).
Until a controller has created the namespace the client serves on its profiles' initial gears,
`unrecorded` (`standins`). The client is its profiles' `Host`; they never import this module.

The swap thread (`_tick()` every `poll_interval`, or when woken) attaches the namespace if not
yet, watches the controller (a new identity: register every profile again, re-attach the
region; none alive: a warning at most every `warn_interval`), polls the snapshot version, lets
every profile warm up and release (`Profile._maintain`), acks the applied version with a
heartbeat in the slot (every `heartbeat_interval`, at most lease.BEAT: the slot's lease, and at
once when it changes), checks with it that the namespace it mapped is still there (`_lost`: its
control segment and ring by inode, its slot still its claim; else it re-attaches: `_reattach`,
the reset a fork does, then a new slot, ring and registrations) and records a memory reading
every `memory_interval` (`memory`, else the first attached runner's backend).
Nothing on the request path waits for it or for the controller, or raises because of them.

With no room in /dev/shm for its ring, or the controller none for its device's snapshot region
(SpaceError), a client serves unrecorded, or a profile on its initial gears, says so and tries
again every `retry_interval`. In a forked child it never writes its parent's (`forking`). From
its construction to its close, the process's npu backends count streams in its namespace's
ledgers (`graphs.streams`). Threads: the ring serialises the process's producer threads itself;
`_profiles` is copy-on-write; adoption runs under `_adopting`, which request threads only try;
only the constructor and the swap thread attach the namespace; `state` (`lifecycle.CLIENT`)
moves only through its `lifecycle.Machine`.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from gearshift import protocol
from gearshift.clock import Clock, MonotonicClock
from gearshift.core.dims import Dim, redeclared
from gearshift.core.group import Group
from gearshift.errors import (
    ConfigError,
    GearshiftError,
    ProfileMismatch,
)
from gearshift.graphs import streams
from gearshift.graphs.streams import NPU_BUDGET
from gearshift.shm import EventRing, Registry, SnapshotRegion, StreamLedger
from gearshift.shm.cleanup import leave
from gearshift.shm.lease import Watch
from gearshift.shm.ring import DEFAULT_CAPACITY
from gearshift.worker import forking, lifecycle
from gearshift.worker.attaching import Attaching
from gearshift.worker.interfaces import Runner, Stoppable
from gearshift.worker.profile import Profile
from gearshift.worker.registration import RegistrationQueue
from gearshift.worker.routing import checked_dims
from gearshift.worker.standins import NO_SNAPSHOT, NoSnapshot, Unrecorded
from gearshift.worker.swap import SwapThread

log = logging.getLogger(__name__)
MemoryReader = Callable[[], tuple[int, int]]  # reads (free, total) bytes of the device
JOIN_TIMEOUT = 5.0


class Client(Attaching):
    """One worker's session on one device: profiles, the event ring, snapshots, the swap thread.

    `registry` is the namespace's control segment, attached (by `connect`), or the namespace's
    name: the client attaches it now if it exists, else from the swap thread once a controller
    has created it (until then `registry` and `slot` are None). It owns the registry and
    `controller` (an embedded one to stop on close). `clock` times heartbeats, readings and
    warnings and stamps events; `memory` returns (free, total) device bytes; with
    `background=False` no swap thread runs (tests and tools run its rounds: `_tick()`). Close
    it (or use it as a context manager); it also closes at interpreter exit."""

    heartbeat_interval = 1.0
    memory_interval = 1.0
    poll_interval = 0.05
    warn_interval = 60.0
    retry_interval = 5.0  # between tries to create a ring /dev/shm had no room for

    def __init__(
        self,
        registry: Registry | str,
        device: int,
        *,
        clock: Clock | None = None,
        memory: MemoryReader | None = None,
        register_timeout: float = 2.0,
        background: bool = True,
        controller: Stoppable | None = None,
        ring_capacity: int = DEFAULT_CAPACITY,
    ) -> None:
        if isinstance(device, bool) or not isinstance(device, int) or device < 0:
            raise ConfigError("device", f"expected a non-negative int, got {device!r}")
        self.namespace = registry if isinstance(registry, str) else registry.namespace
        self.device = device
        self.clock = clock or MonotonicClock()
        self.memory = memory
        self.register_timeout = register_timeout
        self.registry: Registry | None = None  # attached: with its slot and ring
        self.slot: int | None = None
        self._unrecorded = Unrecorded()
        self.ring: EventRing | Unrecorded = self._unrecorded
        self.region: SnapshotRegion | NoSnapshot = NO_SNAPSHOT
        self._seen = 0  # the region version last adopted (or found unreadable)
        self.applied = 0  # the version last acked in the slot
        self._now_ns = self.clock.now_ns
        self._embedded = controller  # the embedded controller this client started, if any
        self._leader = 0  # the pid of the controller the profiles registered with
        self._profiles: dict[str, Profile] = {}
        self._ids = itertools.count()
        self._adopting = threading.Lock()
        self._swap = self._swap_thread(background)
        self._quiet_until = self._next_beat = self._next_memory = float("-inf")
        self._region_stale = False
        self._ring_capacity = ring_capacity
        self._registrations = RegistrationQueue(self.namespace, self._warn, self.clock,
                                            self.retry_interval)
        self._life = lifecycle.Machine(lifecycle.CLIENT, lifecycle.NO_CONTROLLER)
        self._no_room = False  # the last try to create the ring found no room in /dev/shm
        self._retry_at = float("-inf")
        self._watch = Watch()  # leases this client watched (Attaching)
        self._attach(strict=True, given=None if isinstance(registry, str) else registry)
        self._watch_controller()
        self._attach_region()
        streams.install(lambda i: StreamLedger.open(self.namespace, i, NPU_BUDGET), self.namespace)
        self._refresh()
        self._swap.start()
        atexit.register(self.close)
        forking.track(self)

    @property
    def unrecorded(self) -> int:
        """Requests routed before the client had a ring (no controller had started yet)."""
        return self._unrecorded.count

    @property
    def state(self) -> str:
        """"no controller", "attached", "registered" (every profile) or "closed"."""
        return self._life.state

    def _check_registered(self) -> None:
        """Attached, and the controller has answered every profile: registered."""
        with self._life.lock:
            if self.state == lifecycle.ATTACHED and all(
                    p.registered for p in self._profiles.values()):
                self._life.advance("registered")

    def profile(self, name: str, dims: Mapping[str, Dim], *, lazy_start: bool = True,
                group: Group | None = None) -> Profile:
        """The profile `name` with these dims (in record order; `lazy_start`, `group`: see
        `Profile`), registered; ProfileMismatch if it or the controller knows `name` otherwise."""
        dims = checked_dims(name, dims)
        with self._adopting:  # one profile per name, even when threads race to make it
            known = self._profiles.get(name)
            if known is None:
                prof = Profile(self, next(self._ids), name, dims, group=group,
                               lazy_start=lazy_start)
                if prof.id > protocol.MAX_PROFILE_ID:
                    raise ConfigError("profile", f"at most {protocol.MAX_PROFILE_ID + 1} a client")
                with self._life.lock:  # StateError on a closed client
                    self._life.advance("profile")
                    self._profiles = {**self._profiles, name: prof}
        if known is not None:
            if known.dims != dims or known.group != group:
                raise ProfileMismatch(redeclared(name, known.dims, dims) if known.dims != dims
                                      else f"profile {name!r} is of {known.group}, not {group}")
            return known
        self._registrations.add(prof)
        if self.registry is not None and self.registry.controller().alive:
            self._registrations.wait(prof, self.register_timeout)
            if prof.rejected is not None:
                self._forget(prof)
                raise prof.rejected
            self._check_registered()
        self._attach_region()
        self._refresh(force=True)
        return prof

    def _forget(self, prof: Profile) -> None:
        self._registrations.forget(prof)
        with self._adopting:
            self._profiles = {n: p for n, p in self._profiles.items() if p is not prof}

    def _refresh(self, force: bool = False) -> None:
        """Adopt the region's snapshot into every profile if its version changed (or `force`);
        request threads only try. A snapshot that does not read or decode (whatever the
        exception) is logged and kept out, `_seen` moves on, and nothing raises."""
        if not self._adopting.acquire(blocking=force):
            return
        try:
            region = self.region
            version = region.version()
            if version == self._seen and not force:
                return
            try:
                snapshot = region.read()
            except Exception as e:  # shared memory is not trusted, nor is its decoder
                self._warn("namespace %r: unreadable snapshot v%d kept out: %r", self.namespace,
                           version, e)
                self._seen = version
                return
            if snapshot is not None:
                version = snapshot.version
                for prof in self._profiles.values():
                    try:
                        prof._adopt(version, snapshot.payload)
                    except Exception as e:
                        self._warn("namespace %r: snapshot v%d kept out of profile %r: %r",
                                   self.namespace, version, prof.name, e)
            self._seen = version
        finally:
            self._adopting.release()
        self._swap.wake()

    def _wake(self) -> None:
        """Run the swap thread's next tick now (replaced gears drained: graphs may be freed)."""
        self._swap.wake()

    def _attached(self, runner: Runner) -> None:
        """A profile attached `runner`: its backend gives memory readings if nothing else does."""
        backend = getattr(runner, "backend", None)
        if self.memory is None and backend is not None:
            self.memory = backend.mem_get_info
        self._swap.wake()

    def _tick(self) -> bool:
        """One swap thread round (the owner's, if background=False); False: idle (`swap.py`)."""
        now = self.clock.now()
        if self.registry is None:
            self._attach(strict=False)
        self._watch_controller()
        self._registrations.pump()
        self._check_registered()
        if self.region is NO_SNAPSHOT or self._region_stale:
            self._attach_region()
        self._refresh()
        profiles = list(self._profiles.values())
        for prof in profiles:
            prof._maintain()
        applied = self._seen if (settled := all(p.settled for p in profiles)) else self.applied
        registry, slot, ring = self.registry, self.slot, self.ring
        closed = self.state == lifecycle.CLOSED
        if closed or registry is None or slot is None or not isinstance(ring, EventRing):
            return not closed
        if applied != self.applied or now >= self._next_beat:
            lost = self._lost(registry, slot, ring) if now >= self._next_beat else None
            if lost is not None:
                self._reattach(lost)
                return
            registry.beat(slot, self._now_ns(), applied, ring.dropped)
            self.applied, self._next_beat = applied, now + self.heartbeat_interval
        if self.memory is not None and now >= self._next_memory:
            self._next_memory = now + self.memory_interval
            free, total = self.memory()
            ring.put_memory(self._now_ns(), free, total)
        return not settled or any(not p.registered and p.rejected is None for p in profiles)

    def _swap_thread(self, background: bool) -> SwapThread:
        return SwapThread(self._tick, lambda: self.poll_interval, lambda e: self._warn(
            "namespace %r: swap thread tick failed: %r", self.namespace, e), background)

    def _warn(self, message: str, *args: Any) -> None:
        """log.warning, at most once per `warn_interval` of the client's clock."""
        now = self.clock.now()
        if now >= self._quiet_until:
            self._quiet_until = now + self.warn_interval
            log.warning(message, *args)

    def _forked(self, restart: bool = True) -> None:
        """In a forked child (`forking`): drop the parent's handles (slot, ring, mailboxes,
        embedded controller), serve unrecorded; the first record starts a swap thread.
        `restart=False`: the same reset in this process (`_reattach`), its threads and locks
        kept."""
        if self.state == lifecycle.CLOSED:
            return
        if restart:
            self._life = lifecycle.Machine(lifecycle.CLIENT, self.state)  # fresh locks: a
            self._adopting = threading.Lock()  # parent's thread may have held them at the fork
            self._swap = self._swap_thread(self._swap.background)  # the parent's is not here
            self._embedded = None
        self._life.advance("fork")
        self._leader = 0
        self.registry, self.slot = None, None  # the parent's: closed with the child's mappings
        self.ring = self._unrecorded = Unrecorded(
            first_use=self._swap.start if restart else None)
        for prof in self._profiles.values():
            if restart:
                prof._forked(self._unrecorded.write)
            else:
                prof._rebind(self._unrecorded.write)
        if restart:
            self._registrations.forked()
        else:
            self._registrations.unbind()
        self._next_beat = self._next_memory = self._retry_at = float("-inf")

    def close(self) -> None:
        """Stop the swap thread, release the slot, close the ring (the controller drains it);
        `leave` the namespace; stop the embedded controller this client started. Idempotent."""
        with self._life.lock:
            if self.state == lifecycle.CLOSED:
                return
            self._life.advance("close")
        atexit.unregister(self.close)
        streams.release(self.namespace)
        self._swap.stop(JOIN_TIMEOUT)
        registry, slot, ring = self.registry, self.slot, self.ring
        self.region = NO_SNAPSHOT
        if registry is not None and slot is not None and isinstance(ring, EventRing):
            try:
                registry.beat(slot, self._now_ns(), self.applied, ring.dropped)
                registry.release_slot(slot)
            except GearshiftError as e:
                log.warning("namespace %r: releasing slot %d: %s", self.namespace, slot, e)
            ring.close()  # a request thread's later record is a no-op
            registry.close()
            if self._embedded is None:
                leave(self.namespace)
        if self._embedded is not None:
            self._embedded.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
