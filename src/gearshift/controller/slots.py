"""The worker slots as the controller follows them: rings attached, gone workers reclaimed.

A scan reads the slot table below its high-water mark (what was ever claimed: the idle cost
follows the workers, not the slots): a new claim (or a slot claimed anew, a new generation)
becomes a `Worker` and gets its ring attached (without waiting: a ring its worker has not
sealed yet, or another user's, is tried again at the next scan); a CORRUPT slot is counted and
skipped; a slot whose worker is gone (RELEASED, or ACTIVE with a dead identity) is reclaimed
once the registration it left pending is served (`Reclaim`, applied by the controller): its
ring drained to the end into the batch, then `Registry.reclaim` frees the slot and unlinks the
ring, so no recorded event is lost to a reclaim. A slot claimed from another pid namespace
(`foreign`, the ordinary sidecar deployment) is judged by its lease (shm/lease.py): the
registry's watch, timed by the controller's clock, sees its beats at every scan and judges it
dead LEASE seconds after its last one. A worker of another time namespace (its monotonic clock is
not the controller's) has its records dated in the controller's clock by an offset estimated
from its heartbeats (the least gap seen between the controller's clock and its heartbeat), and
stamped at their drain until one is seen (`ingest.dated`). A scan also reads the applied
versions back: a device's propagation lag runs from a publish until every live worker with a
profile on it acknowledged that version. A worker's last valid MEMORY record is its reading: a
device's usage is the highest reading younger than `memory_fresh_seconds` among its live
workers, and its memory (the floor of its graph memory bound) the least total its workers'
latest readings give, so a worker that overstates it cannot raise the floor.

Nothing here calls back into the controller: `scan`, `drain` and `reclaim` return the effects
(`effects`) it applies: `Inherit` for a new claim, `Reclaim` for a gone worker, `Measured` for
drained records (the cost book's), `Failed` for one slot's handling that failed (it fails alone).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gearshift.controller import ingest
from gearshift.controller.config import ControllerConfig
from gearshift.controller.effects import Effect, Failed, Inherit, Measured, Reclaim
from gearshift.errors import LayoutError, NamespaceBusy, NotOwned, Unsealed
from gearshift.shm import EventRing, Registry, SlotInfo, SlotState, mailbox, names, segment

log = logging.getLogger(__name__)

ACK_POLL_SECONDS = 5.0  # after a publish, poll applied versions every iteration this long
BUSY_LOG = 10.0  # seconds: a scan skipped for a busy lock is logged at most this often


@dataclass
class Worker:
    """A claimed slot as this controller sees it; `lut` maps the worker's profile ids to
    global profile keys (its last entry stays -1: ids beyond the table are unknown)."""

    info: SlotInfo
    ring: EventRing | None = None
    lut: np.ndarray = field(default_factory=lambda: np.full(1, -1, np.int64))
    profiles: dict[int, str] = field(default_factory=dict)  # local id -> profile name
    consumed: int = 0
    memory: tuple[float, float, float] | None = None  # (time, used share, device bytes): latest
    offset: float | None = 0.0  # its clock + offset = the controller's (None: not known yet)
    refused: bool = False  # told that its ring's layout is not one this controller reads

    def map(self, local: int, key: int, name: str) -> None:
        if local >= len(self.lut) - 1:
            grown = np.full(local + 2, -1, np.int64)
            grown[: len(self.lut) - 1] = self.lut[:-1]
            self.lut = grown
        self.lut[local] = key
        self.profiles[local] = name

    def keys(self, events: np.ndarray) -> np.ndarray:
        return self.lut[np.minimum(events["profile"], len(self.lut) - 1)]


@dataclass
class Lag:
    """Propagation lag of one device: publish until every live worker acknowledged it."""

    last_seconds: float | None = None
    count: int = 0
    seconds_sum: float = 0.0


class Slots:
    """The claimed slots of `registry`: `workers` by slot, `lags` by device; drained records
    go to `batch` (and, as `Measured` effects, to the cost book)."""

    def __init__(self, registry: Registry, config: ControllerConfig, batch: ingest.Batch) -> None:
        self.registry = registry
        self.config = config
        self.batch = batch
        self.workers: dict[int, Worker] = {}
        self.lags: dict[int, Lag] = {}
        self.reclaimed = 0  # dead workers whose slot was reclaimed (killed, crashed)
        self.exited = 0  # workers that released their slot (closed cleanly), freed alike
        self.corrupt: set[int] = set()  # slots skipped at the last scan: words not ours
        self.lock_busy = 0  # scans skipped: the namespace lock was held past the registry's wait
        self._busy_logged = -math.inf  # when a skipped scan was last logged
        self._awaiting: dict[int, tuple[int, float]] = {}  # device -> (version, published at)
        self._scanned = False  # the first scan reads the whole table (a namespace created
        # before the high-water mark was kept has claims above it)

    def high_water(self) -> int:
        """The slots to poll: below the table's high-water mark, or one we follow."""
        return max(self.registry.high_water(), max(self.workers, default=-1) + 1)

    def scan(self, now: float, spare: int | None = None) -> tuple[bool, list[Effect]]:
        """Follow every claimed slot, forget the freed ones, read the acknowledgements; the
        effects: `Inherit` per new claim, `Reclaim` per gone worker but the slot `spare`'s (a
        registration is being answered for it), `Failed`. False, the scan skipped and counted
        in `lock_busy` (logged at most every BUSY_LOG seconds), when the namespace lock stays
        held past the registry's wait."""
        claimed, corrupt, effects = set(), set(), []
        try:
            table = self.registry.slots(self.high_water() if self._scanned else None)
        except NamespaceBusy as e:
            self.lock_busy += 1
            if now - self._busy_logged >= BUSY_LOG:
                self._busy_logged = now
                log.warning("slot scan skipped (%d so far): %s", self.lock_busy, e)
            return False, []
        for info in table:
            if info.state == SlotState.CORRUPT:
                corrupt.add(info.slot)
            elif info.state != SlotState.FREE:
                claimed.add(info.slot)
                _guarded(effects, f"slot {info.slot}", self._track, info, info.slot != spare,
                         effects, now)
        self._scanned = True
        for slot in set(self.workers) - claimed:  # freed behind our back, or corrupt now
            self._forget(slot)
        if corrupt - self.corrupt:
            log.warning("slots %s are corrupt (state or device word): skipped", sorted(corrupt))
        self.corrupt = corrupt
        self._acks(now)
        return True, effects

    def drain(self, now: float) -> list[Effect]:
        """Drain every attached ring (at most drain_max_events records each) and fold them;
        returns the `Measured` records and the rings that failed (alone: corrupt counters)."""
        effects: list[Effect] = []
        for w in self.workers.values():
            if w.ring is not None:
                _guarded(effects, f"drain of slot {w.info.slot}", self._drain_one, w, now, effects)
        self.batch.flush(now)
        return effects

    def take(self, w: Worker, events: np.ndarray, now: float, effects: list[Effect]) -> None:
        """Count `w`'s drained `events`, keep its latest memory reading, batch them; they go to
        the cost book as a `Measured` effect too."""
        if not len(events):
            return
        events = ingest.dated(events, w.offset, now)
        w.consumed += len(events)
        reading = ingest.memory_reading(events)
        if reading is not None:
            w.memory = reading
        keys = w.keys(events)
        self.batch.add(events, keys, now)
        effects.append(Measured(w.info.slot, events, keys))

    def published(self, device: int, version: int, now: float) -> None:
        """`version` of `device` was published at `now`: time its propagation."""
        self._awaiting[device] = (version, now)

    def polling(self, now: float) -> bool:
        """Whether a publish is recent enough to read the applied versions every iteration."""
        return any(now - t < ACK_POLL_SECONDS for _, t in self._awaiting.values())

    def memory_usage(self, device: int, now: float) -> float | None:
        """The highest fresh reading of the device's live workers (None: no fresh reading)."""
        fresh = now - self.config.memory_fresh_seconds
        readings = [
            w.memory[1]
            for w in self.workers.values()
            if w.info.device == device
            and w.info.alive
            and w.memory is not None
            and w.memory[0] >= fresh
        ]
        return max(readings, default=None)

    def holders(self, device: int, name: str) -> int:
        """The live workers of `device` registered with profile `name`."""
        return sum(w.info.device == device and w.info.alive and name in w.profiles.values()
                   for w in self.workers.values())

    def device_bytes(self, device: int) -> float | None:
        """The device's memory in bytes: the least its workers' latest readings report (a
        worker that overstates it cannot raise the bound's floor; None: none read)."""
        return min((w.memory[2] for w in self.workers.values()
                    if w.info.device == device and w.memory is not None), default=None)

    def close(self) -> None:
        """Unmap every attached ring (the rings themselves stay)."""
        for w in self.workers.values():
            if w.ring is not None:
                w.ring.close()

    def _drain_one(self, w: Worker, now: float, effects: list[Effect]) -> None:
        assert w.ring is not None
        self.take(w, w.ring.drain(self.config.drain_max_events), now, effects)

    def _track(self, info: SlotInfo, reclaim: bool, effects: list[Effect], now: float) -> None:
        """Follow a claimed slot: attach its ring, estimate its clock's offset; `Reclaim` it
        once its worker is gone."""
        w = self.workers.get(info.slot)
        if w is not None and w.info.generation != info.generation:  # claimed anew meanwhile
            self._forget(info.slot)
            w = None
        if w is None:
            w = self.workers[info.slot] = Worker(info, offset=0.0 if info.clock_shared else None)
            effects.append(Inherit(info.slot))
            if info.foreign:
                log.info("slot %d is held by pid %d of another pid namespace: judged by its "
                         "lease", info.slot, info.pid)
        w.info = info
        if not info.clock_shared and info.heartbeat_ns:
            gap = now - info.heartbeat_ns * 1e-9  # the offset plus this read's delay
            if w.offset is None or gap < w.offset:
                w.offset = gap
        if w.ring is None:
            try:
                w.ring = self._attach_ring(info)
            except LayoutError as e:
                if not w.refused:  # said to the worker itself, in its log, at once
                    w.refused = True
                    self.registry.replies(info.slot).post(mailbox.error_reply(LayoutError(
                        f"this controller cannot read the ring of slot {info.slot}: {e}; "
                        "nothing this worker records is read: run one gearshift version on "
                        "the workers and the controller")))
                raise
        if info.reclaimable and reclaim:
            effects.append(Reclaim(info.slot))

    def _attach_ring(self, info: SlotInfo) -> EventRing | None:
        try:
            return EventRing.attach(self.config.namespace, info.slot, timeout=0.0)
        except FileNotFoundError:
            return None  # not created yet, or its worker died before creating it
        except (Unsealed, NotOwned) as e:
            if not info.reclaimable:
                log.debug("slot %d: ring not attached yet: %s", info.slot, e)
                return None  # its worker is still creating it: the next scan tries again
            self._discard_ring(info, e)
            return None
        except LayoutError as e:
            if not info.reclaimable:
                raise
            self._discard_ring(info, e)
            return None

    def reclaim(self, slot: int, now: float) -> list[Effect]:
        """Drain a gone worker's ring to the end, fold it, free the slot, unlink the ring (the
        `Reclaim` a scan returned, once its pending registration is served); returns the
        `Measured` records, and `Failed` if the reclaim failed (tried again at the next scan)."""
        effects: list[Effect] = []
        if slot in self.workers:  # (else forgotten meanwhile: freed behind our back)
            _guarded(effects, f"slot {slot}", self._reclaim, self.workers[slot], now, effects)
        return effects

    def _reclaim(self, w: Worker, now: float, effects: list[Effect]) -> None:
        if w.ring is not None:
            limit = self.config.drain_max_events
            try:
                for _ in range(w.ring.capacity // limit + 2):
                    if not w.ring.pending():
                        break
                    self.take(w, w.ring.drain(limit), now, effects)
            except LayoutError as e:
                w.ring.close()
                w.ring = None
                self._discard_ring(w.info, e)
            self.batch.flush(now)
        self.registry.reclaim(w.info.slot, w.ring)
        self._forget(w.info.slot)
        exited = w.info.state == SlotState.RELEASED
        if exited:
            self.exited += 1
        else:
            self.reclaimed += 1
        log.info(
            "worker pid %d (slot %d, device %d) %s after %d events, %d dropped",
            w.info.pid,
            w.info.slot,
            w.info.device,
            "exited: slot freed" if exited else "died: slot reclaimed",
            w.consumed,
            w.info.dropped,
        )

    def _discard_ring(self, info: SlotInfo, error: Exception) -> None:
        try:
            segment.unlink(names.ring(self.config.namespace, info.slot))
        except NotOwned as foreign:
            log.warning("slot %d: ring of gone pid %d left in place: %s", info.slot, info.pid,
                        foreign)
            return
        log.warning(
            "slot %d: unreadable ring of gone pid %d removed: %s", info.slot, info.pid, error
        )

    def _forget(self, slot: int) -> None:
        w = self.workers.pop(slot)
        if w.ring is not None:
            w.ring.close()

    def _acks(self, now: float) -> None:
        for device, (version, published) in list(self._awaiting.items()):
            live = [
                w
                for w in self.workers.values()
                if w.info.device == device and w.info.alive and w.profiles
            ]
            if all(w.info.applied_version >= version for w in live):
                del self._awaiting[device]
                if live:
                    lag = self.lags.setdefault(device, Lag())
                    lag.last_seconds = now - published
                    lag.count += 1
                    lag.seconds_sum += now - published


def _guarded(effects: list[Effect], what: str, fn: Callable[..., object], *args: Any) -> None:
    """Run `fn(*args)`; its failure becomes a `Failed` effect, and the caller goes on."""
    try:
        fn(*args)
    except Exception as e:
        effects.append(Failed(what, e))
