"""Control segment: controller identity and the table of worker slots of a namespace.

    offset         size  field             written by         when
    0              8     magic             creator            once, last of the header
    8              8     layout            creator            once
    16             8     slots             creator            once (number of worker slots)
    24             8     slot_size         creator            once (S below)
    32             8     mailbox_capacity  creator            once (M below)
    40             8     closed            cleanup            under the lock, before unlinking
    64             8     controller        controller         claim under the lock (an identity)
    72             8     controller_beat   controller         any time (monotonic ns, its clock)
    80             8     lock_owner        lock holder        on acquiring; 0 before releasing
    88             8     lock_count        lock holder        on acquiring, +1 (a repairer: +1)
    96             8     high_water        claimer            under the lock (top slot claimed + 1)
    104            8     lock_realm        lock holder        on acquiring, before lock_owner
    112            8     controller_realm  controller         claim under the lock, before its id
    120            8     controller_beats  controller         every iteration, +1 (its lease)
    128            8     discarded         claimer            under the lock, + events of a reused
                                                              slot's ring dropped without a drain
    192+i*S        8     state[i]          claimer/releaser   under the lock, last of a claim
    192+i*S+8      8     ident[i]          claimer            under the lock (pid + start time)
    192+i*S+16     8     device[i]         claimer            under the lock
    192+i*S+24     8     generation[i]     claimer            under the lock, +1 per claim
    192+i*S+32     8     heartbeat[i]      worker             any time (monotonic ns, its clock)
    192+i*S+40     8     applied[i]        worker             any time (snapshot version)
    192+i*S+48     8     dropped[i]        worker             any time (its ring's counter)
    192+i*S+56     8     realm[i]          claimer            under the lock (liveness.realm)
    192+i*S+64     8     beats[i]          worker             every heartbeat, +1 (its lease)
    192+i*S+128    64+M  requests[i]       worker/controller  mailbox protocol (mailbox.py)
    192+i*S+192+M  64+M  replies[i]        controller/worker  mailbox protocol (mailbox.py)
    (slot i of `slots`; S = 128 + 2 * (64 + M) bytes per slot, M = mailbox payload bytes)

Why nothing is read torn: every field is one aligned 8-byte word stored once per change;
identities pack pid and start time into one word (liveness.py). Multi-word slot changes (claim,
release, reclaim, close) happen only under the namespace semaphore `/gearshift.<ns>.lock`, and
the table is read under it (`slots()`), so a reader never sees a half-claimed slot. The
worker-written words have a single writer each and are meaningful on their own.

Nothing read is trusted: header constants beyond MAX_SLOTS or MAX_MAILBOX_CAPACITY are a
LayoutError; a slot whose state word is not a SlotState, or whose device exceeds MAX_DEVICE, reads
as CORRUPT (skipped by the controller, shown by `gearshift status`, never fatal to the table);
counters wrap at 64 bits. `closed` holds the identity of the cleanup that closed the namespace:
no slot and no controller is claimed in a closed namespace.

Liveness is judged by lease.py: the identity (pid and start time) where the participant's realm
(its pid and time namespaces) is the judge's, else its lease (the beats counter lease.renewer
bumps for it), watched by the judge's `Watch` (`self.watch`, timed by `self.clock`). A lock
holder that dies would block everyone: holders record themselves in `lock_owner`, waiters give
up after `wait` (default `lock.timeout`) with NamespaceBusy naming it, and `repair_lock()` (the
controller every iteration, `cleanup` and `own`) releases a dead holder's lock (lock.py). A
worker that finds no FREE slot reuses a released or dead one (reuse.py).
The controller clears its identity without the lock: only a claimant overwrites a live one's.
Claims take the lowest free slot and raise `high_water`, which bounds what the controller polls.

Worker: `slot = claim_slot(device)`; `EventRing.create(ns, slot)`; register profiles by
`requests(slot).post(msg)` and poll `replies(slot).take()` (`mailbox.raise_for_error`); then
`beat(slot, ...)` at least every lease.BEAT seconds; `holds(slot)` says whether the slot is
still its own (not reclaimed by a judge that took it for dead); on exit close the ring (do
not unlink it) and `release_slot(slot)`.
Controller: `Registry.open(ns)`, `repair_lock()`, `claim_controller(wait)` (leadership.py);
every tick `owns_controller()` (else another took over: stop), `beat_controller(now)`,
`slots(high_water())`, drain each ACTIVE/RELEASED slot's ring (re-attach when its generation
changes), answer requests; for a `reclaimable` slot drain its ring to the end, then
`reclaim(slot, ring)`, which unlinks the ring and frees the slot. The controller never frees a
slot while its ring holds events; a worker reusing one without a live controller counts them.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from gearshift.clock import Clock, MonotonicClock
from gearshift.errors import (
    ConfigError,
    ControllerNotFound,
    ControllerRunning,
    NamespaceBusy,
    NotOwned,
)
from gearshift.shm import lease, liveness, lock, names, segment
from gearshift.shm.leadership import CONTROLLER as CONTROLLER
from gearshift.shm.leadership import CONTROLLER_BEAT as CONTROLLER_BEAT
from gearshift.shm.leadership import CONTROLLER_BEATS as CONTROLLER_BEATS
from gearshift.shm.leadership import CONTROLLER_REALM as CONTROLLER_REALM
from gearshift.shm.leadership import Leadership
from gearshift.shm.lease import Watch
from gearshift.shm.lock import NamespaceLock
from gearshift.shm.mailbox import Mailbox
from gearshift.shm.reuse import reusable
from gearshift.shm.segment import LINE, Segment
from gearshift.shm.slotinfo import MAX_DEVICE, SlotInfo, SlotState, judge

if TYPE_CHECKING:
    from gearshift.shm.ring import EventRing

MAGIC = int.from_bytes(b"gs.ctl\0\0", "little")
LAYOUT = 2
SLOTS, SLOT_SIZE, MAILBOX_CAPACITY = 2, 3, 4  # header constant word indices
CLOSED, LOCK_OWNER, LOCK_COUNT, HIGH_WATER = 40, 80, 88, 96  # byte offsets
LOCK_REALM, DISCARDED = 104, 128  # (controller words: leadership.py; lock_count: lock.py)
TABLE = 192
STATE, IDENT, DEVICE, GENERATION = 0, 8, 16, 24  # offsets inside a slot: under the lock
HEARTBEAT, APPLIED, DROPPED = 32, 40, 48  # written by the slot's worker
REALM = 56  # the claimer's realm (liveness.realm), under the lock
BEATS = 64  # the worker's lease counter
REQUESTS = 128  # then the two mailboxes
_ROW = (STATE, IDENT, DEVICE, GENERATION, HEARTBEAT, APPLIED, DROPPED, REALM, BEATS)
DEFAULT_SLOTS = 64
DEFAULT_MAILBOX_CAPACITY = 8192
MAX_SLOTS = 4096  # bounds of the header constants an attacher accepts
MAX_MAILBOX_CAPACITY = 1 << 20
LOCK_TIMEOUT = lock.TIMEOUT
_WORD = (1 << 64) - 1


class Registry(Leadership):
    """The control segment of `namespace`, attached; see the module docstring for roles."""

    def __init__(self, namespace: str, seg: Segment, lock: NamespaceLock) -> None:
        self.namespace, self.segment, self.lock, self._words = namespace, seg, lock, seg.words
        self._me = 0  # this process's identity once it claimed the controller (leadership)
        self._claimed: dict[int, int] = {}  # slot -> generation this process claimed it at
        self.wait: float | None = None  # the longest wait for the lock (None: lock.timeout)
        self.watch = Watch()  # this process's observations of leases (lease.py)
        self.clock: Clock = MonotonicClock()  # times them (the controller sets its own)
        self.nslots, self._slot_size, capacity = seg.words[SLOTS : MAILBOX_CAPACITY + 1]
        base = [TABLE + slot * self._slot_size for slot in range(self.nslots)]
        self._requests = [Mailbox(seg, b + REQUESTS, capacity) for b in base]
        replies = REQUESTS + Mailbox.size(capacity)
        self._replies = [Mailbox(seg, b + replies, capacity) for b in base]

    @classmethod
    def create(
        cls,
        namespace: str,
        slots: int = DEFAULT_SLOTS,
        mailbox_capacity: int = DEFAULT_MAILBOX_CAPACITY,
    ) -> Registry:
        """Create the namespace's control segment and lock; NamespaceBusy if it exists
        (NotOwned if it, or the lock, is another user's)."""
        if not _fits(slots, mailbox_capacity):
            raise ValueError(
                f"need 1..{MAX_SLOTS} slots and a mailbox capacity that is a multiple of 64 "
                f"up to {MAX_MAILBOX_CAPACITY}"
            )
        slot_size = _slot_size(mailbox_capacity)
        seg = Segment.create(names.control(namespace), TABLE + slots * slot_size)
        try:  # a lock left by a namespace that was cleaned up half-way is stale: replace it
            lock = NamespaceLock.create(namespace, seg.words, *_LOCK_WORDS)
        except BaseException as e:
            error = segment.no_room(e, names.lock(namespace), 32)  # a sem_t, on a full tmpfs
            seg.unlink()
            seg.close()
            raise error from None
        seg.seal(MAGIC, LAYOUT, (slots, slot_size, mailbox_capacity))
        return cls(namespace, seg, lock)

    @classmethod
    def attach(cls, namespace: str, relock: bool = False) -> Registry:
        """Attach the namespace's control segment; ControllerNotFound if there is none (or it
        has no lock: it is being removed; `relock`, cleanup's, gives it a new one), NotOwned
        if it or the lock is another user's."""
        try:
            seg = Segment.attach(names.control(namespace), MAGIC, LAYOUT)
        except FileNotFoundError:
            raise ControllerNotFound(f"namespace {namespace!r} has no control segment") from None
        slots, slot_size, capacity = seg.words[SLOTS : MAILBOX_CAPACITY + 1]
        valid = _fits(slots, capacity) and slot_size == _slot_size(capacity)
        seg.require(valid, TABLE + slots * slot_size)
        try:
            try:
                lock = NamespaceLock.open(namespace, seg.words, *_LOCK_WORDS)
            except FileNotFoundError:
                if not relock:
                    raise
                lock = NamespaceLock.create(namespace, seg.words, *_LOCK_WORDS)
        except FileNotFoundError:
            seg.close()
            raise ControllerNotFound(f"namespace {namespace!r} is being cleaned up") from None
        except BaseException:
            seg.close()
            raise
        return cls(namespace, seg, lock)

    @classmethod
    def open(cls, namespace: str, slots: int = DEFAULT_SLOTS) -> Registry:
        """Attach the control segment, creating it first if it does not exist (it may be
        `closed`: `cleanup.own` is the controller's start, which waits out a cleanup)."""
        try:
            return cls.create(namespace, slots)
        except NamespaceBusy as e:
            if isinstance(e, NotOwned):
                raise
            return cls.attach(namespace)

    @property
    def closed(self) -> int:
        """The identity of the cleanup that closed the namespace (0: open)."""
        return self._word(CLOSED)

    # worker side

    def claim_slot(self, device: int) -> int:
        """Claim a slot for this process on `device` (0..MAX_DEVICE, else ConfigError): the
        lowest FREE one, else a released or dead one (`_reusable`); NamespaceBusy if none is."""
        if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device <= MAX_DEVICE:
            raise ConfigError("device", f"expected an int in [0, {MAX_DEVICE}], got {device!r}")
        me = liveness.current()
        with self._locked():
            if self._word(CLOSED):
                raise ControllerNotFound(f"namespace {self.namespace!r} was cleaned up")
            free = [s for s in range(self.nslots) if self._slot_word(s, STATE) == SlotState.FREE]
            slot = free[0] if free else reusable(self)
            if slot is None:
                raise NamespaceBusy(
                    f"all {self.nslots} worker slots of {self.namespace!r} are held by live "
                    "workers (or by workers of another pid namespace whose lease has not "
                    f"expired yet: {lease.LEASE:g} s)"
                )
            generation = (self._slot_word(slot, GENERATION) + 1) & _WORD
            fields = {IDENT: me, DEVICE: device, GENERATION: generation,
                      REALM: liveness.realm()}
            fields.update(dict.fromkeys((HEARTBEAT, APPLIED, DROPPED, BEATS), 0))
            for offset, value in fields.items():
                self._set_slot(slot, offset, value)
            self._requests[slot].reset()
            self._replies[slot].reset()
            self._set_slot(slot, STATE, SlotState.ACTIVE)
            self._set(HIGH_WATER, max(min(self._word(HIGH_WATER), self.nslots), slot + 1))
            self._claimed[slot] = generation
        lease.renewer.add((id(self), slot), lambda: self.renew(slot))
        return slot

    @property
    def discarded(self) -> int:
        """Events of reused slots' rings dropped undrained (reuse.py), since creation."""
        return self._word(DISCARDED)

    def add_discarded(self, events: int) -> None:
        """Under the lock: count `events` a reused slot's ring held (reuse.py)."""
        self._set(DISCARDED, (self._word(DISCARDED) + events) & _WORD)

    def release_slot(self, slot: int) -> bool:
        """Detach this process from `slot` (its ring stays for the controller to drain)."""
        with self._locked():
            if not self.holds(slot):
                return False
            self._set_slot(slot, STATE, SlotState.RELEASED)
            self._claimed.pop(slot, None)
        lease.renewer.remove((id(self), slot))
        return True

    def holds(self, slot: int) -> bool:
        """Whether `slot` is still this process's claim (not freed and claimed anew by a judge
        that took this process for dead)."""
        return (
            self._slot_word(slot, STATE) == SlotState.ACTIVE
            and self._slot_word(slot, IDENT) == liveness.current()
        )

    def renew(self, slot: int) -> None:
        """Bump the lease of `slot` if it is still this process's claim (lease.renewer's)."""
        if self.holds(slot):
            self._set_slot(slot, BEATS, (self._slot_word(slot, BEATS) + 1) & _WORD)

    def beat(self, slot: int, now_ns: int, applied_version: int, dropped: int) -> None:
        """The worker's lock-free report: heartbeat, applied snapshot version, dropped events,
        and its lease beat (at least every lease.BEAT seconds)."""
        self._set_slot(slot, HEARTBEAT, now_ns)
        self._set_slot(slot, APPLIED, applied_version)
        self._set_slot(slot, DROPPED, dropped)
        self._set_slot(slot, BEATS, (self._slot_word(slot, BEATS) + 1) & _WORD)

    def requests(self, slot: int) -> Mailbox:
        """Worker -> controller mailbox of `slot`."""
        return self._requests[slot]

    def replies(self, slot: int) -> Mailbox:
        """Controller -> worker mailbox of `slot`."""
        return self._replies[slot]

    # controller side

    def high_water(self) -> int:
        """1 + the highest slot ever claimed (bounded by `nslots`): every slot at or above it
        is FREE, unless a process that is not ours wrote the table."""
        return min(self._word(HIGH_WATER), self.nslots)

    def slots(self, limit: int | None = None) -> list[SlotInfo]:
        """A consistent copy of the slot table, or of its first `limit` slots (FREE ones
        included)."""
        count = self.nslots if limit is None else max(0, min(limit, self.nslots))
        with self._locked():
            rows = [self.row(slot) for slot in range(count)]
        now = self.clock.now()
        return [judge(slot, row, self.watch, now) for slot, row in enumerate(rows)]

    def reclaim(self, slot: int, ring: EventRing | None) -> None:
        """Free a reclaimable slot, and unlink and close its ring, which must be attached and
        drained (the slot reads FREE only once the ring's memory is given back).

        Pass `ring=None` only if the worker died before creating its ring (an object of
        another user under its name is no ring of ours). NamespaceBusy if the worker is alive,
        or the ring still holds events or exists but was not passed.
        """
        with self._locked():
            info = judge(slot, self.row(slot), self.watch, self.clock.now())
            if not info.reclaimable:
                raise NamespaceBusy(f"slot {slot} is {info.state.name} with live pid {info.pid}")
            name = names.ring(self.namespace, slot)
            if ring is None:
                found = segment.stat_of(name)
                if found is not None and segment.is_ours(name, found):
                    raise NamespaceBusy(f"{name} exists: attach and drain it before reclaiming")
            else:
                assert ring.name == name, f"{ring.name} is not the ring of slot {slot}"
                if ring.pending():
                    raise NamespaceBusy(f"{name} still holds {ring.pending()} events: drain it")
                ring.unlink()
                ring.close()  # a tmpfs object's pages go with its last mapping: FREE means room
            self._set_slot(slot, IDENT, 0)
            self._set_slot(slot, STATE, SlotState.FREE)

    def repair_lock(self, clock: Clock | None = None, wait: bool = True) -> bool:
        """Release the lock if its holder died holding it: the recorded holder is dead, or none
        is recorded for a whole `lock.timeout` (a holder killed between acquiring and recording
        itself, or between clearing and releasing; a live one passes there in microseconds).
        `wait`: wait until an unrecorded holder is judged; else this call only observes and
        the judgement comes at a later call. Two repairers at once are serialised (lock.py):
        the lock is released once."""
        return self.lock.repair(self.segment, clock, wait)

    def retire(self) -> None:
        """Close the namespace for good (before cleanup unlinks it), recording this process as
        its closer; refuses while anyone lives (as this registry judges: lease.py)."""
        me = liveness.current()
        with self._locked():
            owner = self.controller()
            if owner.alive:
                raise ControllerRunning(self.namespace, owner.pid)
            now = self.clock.now()
            for slot in range(self.nslots):
                info = judge(slot, self.row(slot), self.watch, now)
                if info.alive:
                    where = " of another pid namespace" if info.foreign else ""
                    raise NamespaceBusy(
                        f"namespace {self.namespace!r} has a live worker, pid {info.pid}{where} "
                        f"(slot {slot})"
                    )
            self._set(CLOSED, me)

    def close(self) -> None:
        """Unmap; its leases are no longer renewed (a live claim lapses after lease.LEASE)."""
        for key in [(id(self), slot) for slot in self._claimed] + [(id(self), "controller")]:
            lease.renewer.remove(key)
        self.lock.close()
        self.segment.close()

    def unlink(self) -> None:
        """Remove the lock, then the control segment (the owner only; `cleanup` otherwise):
        each only while its name still stands for the object this registry opened."""
        self.lock.unlink()
        self.segment.unlink()

    # internals

    def _locked(self) -> AbstractContextManager[None]:
        return self.lock.held(self.wait)

    def row(self, slot: int) -> tuple[int, ...]:
        """The words of `slot` that `slotinfo.judge` reads (under the lock, for a consistent
        row)."""
        return tuple(self._slot_word(slot, offset) for offset in _ROW)

    def _word(self, offset: int) -> int:
        return self._words[offset // 8]

    def _set(self, offset: int, value: int) -> None:
        self._words[offset // 8] = value

    def _slot_word(self, slot: int, offset: int) -> int:
        return self._words[(TABLE + slot * self._slot_size + offset) // 8]

    def _set_slot(self, slot: int, offset: int, value: int) -> None:
        self._words[(TABLE + slot * self._slot_size + offset) // 8] = value


_LOCK_WORDS = (LOCK_OWNER // 8, LOCK_REALM // 8)  # NamespaceLock's words (lock_count follows)


def _slot_size(mailbox_capacity: int) -> int:
    return REQUESTS + 2 * Mailbox.size(mailbox_capacity)


def _fits(slots: int, capacity: int) -> bool:
    """Header constants within the layout's bounds."""
    return 1 <= slots <= MAX_SLOTS and LINE <= capacity <= MAX_MAILBOX_CAPACITY and not (
        capacity % LINE
    )
