"""Control segment: controller identity and the table of worker slots of a namespace.

    offset         size  field             written by         when
    0              8     magic             creator            once, last of the header
    8              8     layout            creator            once
    16             8     slots             creator            once (number of worker slots)
    24             8     slot_size         creator            once (S below)
    32             8     mailbox_capacity  creator            once (M below)
    40             8     closed            cleanup            under the lock, before unlinking
    64             8     controller        controller         claim under the lock (an identity)
    72             8     controller_beat   controller         any time (monotonic ns)
    80             8     lock_owner        lock holder        on acquiring; 0 before releasing
    88             8     lock_count        lock holder        on acquiring, +1 (a repairer: +1)
    96             8     high_water        claimer            under the lock (top slot claimed + 1)
    128+i*S        8     state[i]          claimer/releaser   under the lock, last of a claim
    128+i*S+8      8     ident[i]          claimer            under the lock (pid + start time)
    128+i*S+16     8     device[i]         claimer            under the lock
    128+i*S+24     8     generation[i]     claimer            under the lock, +1 per claim
    128+i*S+32     8     heartbeat[i]      worker             any time (monotonic ns)
    128+i*S+40     8     applied[i]        worker             any time (snapshot version)
    128+i*S+48     8     dropped[i]        worker             any time (its ring's counter)
    128+i*S+56     8     pidns[i]          claimer            under the lock (its pid namespace)
    128+i*S+64     64+M  requests[i]       worker/controller  mailbox protocol (mailbox.py)
    128+i*S+128+M  64+M  replies[i]        controller/worker  mailbox protocol (mailbox.py)
    (slot i of `slots`; S = 64 + 2 * (64 + M) bytes per slot, M = mailbox payload bytes)

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

Liveness is an identity check (pid and start time, robust to pid reuse), not a heartbeat; the
heartbeats are for display and hang detection. A slot claimed from another pid namespace (its
`pidns`, the claimer's /proc/self/ns/pid inode, is not ours) reads as `foreign`: its identity
means nothing here, so it is never alive nor reclaimable (only released). A lock holder that
dies would block everyone: holders record themselves in `lock_owner`, waiters give up after
`wait` (default `lock.timeout`) with NamespaceBusy naming it, and `repair_lock()` (run by the
controller every iteration, and by `cleanup` and `own`) releases a dead holder's lock (lock.py).
The controller clears its identity without the lock: only a claimant overwrites a live one's.
Claims take the lowest free slot and raise `high_water`, which bounds what the controller polls.

Worker: `slot = claim_slot(device)`; `EventRing.create(ns, slot)`; register profiles by
`requests(slot).post(msg)` and poll `replies(slot).take()` (`mailbox.raise_for_error`); then
`beat(slot, ...)` now and then; on exit close the ring (do not unlink it) and `release_slot(slot)`.
Controller: `Registry.open(ns)`, `repair_lock()`, `claim_controller()`; every tick
`beat_controller(now)`, `slots(high_water())`, drain each ACTIVE/RELEASED slot's ring
(re-attach when its generation changes), answer requests; for a `reclaimable` slot drain its
ring to the end, then `reclaim(slot, ring)`, which unlinks the ring and frees the slot. A slot
is never freed while its ring holds events.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from gearshift.clock import Clock
from gearshift.errors import (
    ConfigError,
    ControllerNotFound,
    ControllerRunning,
    NamespaceBusy,
    NotOwned,
)
from gearshift.shm import liveness, lock, names, segment
from gearshift.shm.lock import NamespaceLock
from gearshift.shm.mailbox import Mailbox
from gearshift.shm.segment import LINE, Segment
from gearshift.shm.slotinfo import MAX_DEVICE, ControllerInfo, SlotInfo, SlotState, judge

if TYPE_CHECKING:
    from gearshift.shm.ring import EventRing

MAGIC = int.from_bytes(b"gs.ctl\0\0", "little")
LAYOUT = 1
SLOTS, SLOT_SIZE, MAILBOX_CAPACITY = 2, 3, 4  # header constant word indices
CLOSED, CONTROLLER, CONTROLLER_BEAT, LOCK_OWNER = 40, 64, 72, 80  # byte offsets
LOCK_COUNT, HIGH_WATER = 88, 96  # byte offsets (lock_count: the lock's, lock.py)
TABLE = 128
STATE, IDENT, DEVICE, GENERATION = 0, 8, 16, 24  # offsets inside a slot: under the lock
HEARTBEAT, APPLIED, DROPPED = 32, 40, 48  # written by the slot's worker
PIDNS = 56  # the claimer's pid namespace, under the lock
REQUESTS = 64  # then the two mailboxes
_ROW = (STATE, IDENT, DEVICE, GENERATION, HEARTBEAT, APPLIED, DROPPED, PIDNS)  # SlotInfo's
DEFAULT_SLOTS = 64
DEFAULT_MAILBOX_CAPACITY = 8192
MAX_SLOTS = 4096  # bounds of the header constants an attacher accepts
MAX_MAILBOX_CAPACITY = 1 << 20
LOCK_TIMEOUT = lock.TIMEOUT
_WORD = (1 << 64) - 1


class Registry:
    """The control segment of `namespace`, attached; see the module docstring for roles."""

    def __init__(self, namespace: str, seg: Segment, lock: NamespaceLock) -> None:
        self.namespace, self.segment, self.lock, self._words = namespace, seg, lock, seg.words
        self._me = 0  # this process's identity once it claimed the controller
        self.wait: float | None = None  # the longest wait for the lock (None: lock.timeout)
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
            lock = NamespaceLock.create(namespace, seg.words, LOCK_OWNER // 8)
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
                lock = NamespaceLock.open(namespace, seg.words, LOCK_OWNER // 8)
            except FileNotFoundError:
                if not relock:
                    raise
                lock = NamespaceLock.create(namespace, seg.words, LOCK_OWNER // 8)
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

    # controller identity

    def claim_controller(self) -> None:
        """Make this process the controller; ControllerRunning if another live one is,
        ControllerNotFound if the namespace was closed for removal."""
        me = liveness.current()
        with self._locked():
            if self._word(CLOSED):
                raise ControllerNotFound(f"namespace {self.namespace!r} is being cleaned up")
            owner = self._word(CONTROLLER)
            if owner != me and liveness.alive(owner):
                raise ControllerRunning(self.namespace, liveness.pid_of(owner))
            self._set(CONTROLLER, me)
        self._me = me

    def owns_controller(self) -> bool:
        """Whether the controller word still names this process since `claim_controller` (one
        read: the controller checks it every iteration and claims again if it was overwritten)."""
        return self._me != 0 and self._word(CONTROLLER) == self._me

    def release_controller(self) -> None:
        """Clear the controller word if it names this process; without the lock (it may be
        held by a stopped or dead process): while this process lives, no claimant writes it."""
        if self._word(CONTROLLER) == liveness.current():
            self._set(CONTROLLER, 0)

    def controller(self) -> ControllerInfo:
        owner = self._word(CONTROLLER)
        return ControllerInfo(
            liveness.pid_of(owner), liveness.alive(owner), self._word(CONTROLLER_BEAT), owner
        )

    def beat_controller(self, now_ns: int) -> None:
        self._set(CONTROLLER_BEAT, now_ns)

    # worker side

    def claim_slot(self, device: int) -> int:
        """Claim a free slot for this process on `device` (0..MAX_DEVICE, else ConfigError);
        NamespaceBusy if none is free."""
        if isinstance(device, bool) or not isinstance(device, int) or not 0 <= device <= MAX_DEVICE:
            raise ConfigError("device", f"expected an int in [0, {MAX_DEVICE}], got {device!r}")
        me = liveness.current()
        with self._locked():
            if self._word(CLOSED):
                raise ControllerNotFound(f"namespace {self.namespace!r} was cleaned up")
            free = [s for s in range(self.nslots) if self._slot_word(s, STATE) == SlotState.FREE]
            if not free:
                raise NamespaceBusy(
                    f"all {self.nslots} worker slots of {self.namespace!r} are taken"
                )
            slot = free[0]
            generation = (self._slot_word(slot, GENERATION) + 1) & _WORD
            pidns = liveness.pid_namespace()
            fields = {IDENT: me, DEVICE: device, GENERATION: generation, PIDNS: pidns}
            fields.update(dict.fromkeys((HEARTBEAT, APPLIED, DROPPED), 0))
            for offset, value in fields.items():
                self._set_slot(slot, offset, value)
            self._requests[slot].reset()
            self._replies[slot].reset()
            self._set_slot(slot, STATE, SlotState.ACTIVE)
            self._set(HIGH_WATER, max(min(self._word(HIGH_WATER), self.nslots), slot + 1))
            return slot

    def release_slot(self, slot: int) -> bool:
        """Detach this process from `slot` (its ring stays for the controller to drain)."""
        me = liveness.current()
        with self._locked():
            if (
                self._slot_word(slot, IDENT) != me
                or self._slot_word(slot, STATE) != SlotState.ACTIVE
            ):
                return False
            self._set_slot(slot, STATE, SlotState.RELEASED)
            return True

    def beat(self, slot: int, now_ns: int, applied_version: int, dropped: int) -> None:
        """The worker's lock-free report: heartbeat, applied snapshot version, dropped events."""
        self._set_slot(slot, HEARTBEAT, now_ns)
        self._set_slot(slot, APPLIED, applied_version)
        self._set_slot(slot, DROPPED, dropped)

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
            rows = [self._row(slot) for slot in range(count)]
        return [judge(slot, row) for slot, row in enumerate(rows)]

    def reclaim(self, slot: int, ring: EventRing | None) -> None:
        """Free a reclaimable slot and unlink its ring, which must be attached and drained.

        Pass `ring=None` only if the worker died before creating its ring (an object of
        another user under its name is no ring of ours). NamespaceBusy if the worker is alive,
        or the ring still holds events or exists but was not passed.
        """
        with self._locked():
            info = judge(slot, self._row(slot))
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
        its closer; refuses while anyone lives."""
        me = liveness.current()
        with self._locked():
            owner = self._word(CONTROLLER)
            if liveness.alive(owner):
                raise ControllerRunning(self.namespace, liveness.pid_of(owner))
            for slot in range(self.nslots):
                ident = self._slot_word(slot, IDENT)
                if self._slot_word(slot, STATE) == SlotState.ACTIVE and liveness.alive(ident):
                    raise NamespaceBusy(
                        f"namespace {self.namespace!r} has a live worker, pid "
                        f"{liveness.pid_of(ident)} (slot {slot})"
                    )
            self._set(CLOSED, me)

    def close(self) -> None:
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

    def _row(self, slot: int) -> tuple[int, ...]:
        return tuple(self._slot_word(slot, offset) for offset in _ROW)

    def _word(self, offset: int) -> int:
        return self._words[offset // 8]

    def _set(self, offset: int, value: int) -> None:
        self._words[offset // 8] = value

    def _slot_word(self, slot: int, offset: int) -> int:
        return self._words[(TABLE + slot * self._slot_size + offset) // 8]

    def _set_slot(self, slot: int, offset: int, value: int) -> None:
        self._words[(TABLE + slot * self._slot_size + offset) // 8] = value


def _slot_size(mailbox_capacity: int) -> int:
    return REQUESTS + 2 * Mailbox.size(mailbox_capacity)


def _fits(slots: int, capacity: int) -> bool:
    """Header constants within the layout's bounds."""
    return 1 <= slots <= MAX_SLOTS and LINE <= capacity <= MAX_MAILBOX_CAPACITY and not (
        capacity % LINE
    )
