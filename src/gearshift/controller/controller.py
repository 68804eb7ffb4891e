"""The controller: the imperative shell around the pure policy (DESIGN.md §1, §6).

One iteration (`step`), every drain_interval_seconds:

1. heartbeat; the slot table every scan_interval_seconds, and every iteration for a few
   seconds after a publish: attach new workers' rings, drain dead workers' rings to the end
   and reclaim their slots, read back applied versions (propagation lag per device);
2. registrations from the slots' request mailboxes;
3. drain every ring (at most drain_max_events each) and fold the samples into DimStats per
   (device, profile, dim), in numpy batches; keep each worker's latest memory reading;
4. per device, every check_interval_seconds: `should_update` -> `decide` per profile ->
   publish snapshot v+1 if a gear changed; the state file is saved after any change;
5. every status_interval_seconds: the status document (`gearshift status`, metrics).

An exception in one phase is logged (at most every 10 s per phase) and the loop goes on.

Versions only increase: a device's snapshot is published at max(region version, saved
version) + 1, so they continue across restarts, takeovers and recreated segments. On start
every restored device is published once, so workers and state agree even if the previous
controller died between a publish and its save.

Graceful stop (`close`, also the end of `run`): final drain, reclaim, state saved, status
published, identity released. While live workers hold slots every segment stays: they keep
serving on their last snapshot, and the next controller takes the namespace over. With no
live worker the namespace is removed, as `gearshift cleanup` would.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gearshift.clock import Clock, MonotonicClock
from gearshift.controller import ingest, statefile, status
from gearshift.controller.config import ControllerConfig, InitialGears
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim
from gearshift.core.gears import starting_gears
from gearshift.core.round import DeviceLedger, ProfileLedger, decide_round
from gearshift.errors import (
    ControllerRunning,
    LayoutError,
    NamespaceBusy,
    PayloadError,
    ProfileMismatch,
    ShapeError,
    StateError,
)
from gearshift.protocol import parse_register, snapshot_payload
from gearshift.shm import (
    EventRing,
    Registry,
    SlotInfo,
    SlotState,
    SnapshotRegion,
    cleanup,
    error_reply,
    names,
    segment,
)

log = logging.getLogger(__name__)

ERROR_LOG_SECONDS = 10.0  # an error repeating in a phase is logged at most this often
ACK_POLL_SECONDS = 5.0  # after a publish, poll applied versions every iteration this long


@dataclass
class Worker:
    """A claimed slot as this controller sees it; `lut` maps the worker's profile ids to
    global profile keys (its last entry stays -1: ids beyond the table are unknown)."""

    info: SlotInfo
    ring: EventRing | None = None
    lut: np.ndarray = field(default_factory=lambda: np.full(1, -1, np.int64))
    profiles: dict[int, str] = field(default_factory=dict)  # local id -> profile name
    consumed: int = 0
    memory: tuple[float, float] | None = None  # (time, used share) of its latest reading

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


class Controller:
    """One namespace's controller; `open` it, then `run(stop)` or call `step()` yourself."""

    region_type: type[SnapshotRegion] = SnapshotRegion  # of the devices' snapshot regions

    def __init__(
        self,
        config: ControllerConfig,
        policy: PolicyConfig,
        registry: Registry,
        clock: Clock,
        initial_gears: InitialGears,
        embedded: bool,
    ) -> None:
        self.config = config
        self.policy = policy
        self.registry = registry
        self.clock = clock
        self.initial_gears = initial_gears
        self.embedded = embedded
        self.devices: dict[int, DeviceLedger] = {}
        self.workers: dict[int, Worker] = {}
        self.counts = dict.fromkeys(
            ("consumed", "folded", "unknown", "invalid", "reclaimed_workers", "errors"), 0
        )
        self.round_seconds: deque[float] = deque(maxlen=1024)
        self.rounds = {"count": 0, "seconds_sum": 0.0, "last_seconds": None}
        self.status: dict[str, Any] | None = None  # the last document published
        self.changes: dict[int, dict[str, list[list[Any]]]] = {}  # last round, per profile
        self.lags: dict[int, Lag] = {}
        self._keys: dict[tuple[int, str], int] = {}
        self._targets: list[tuple[int, str]] = []
        self._regions: dict[int, SnapshotRegion] = {}
        self._awaiting: dict[int, tuple[int, float]] = {}  # device -> (version, published at)
        self._next_check: dict[int, float] = {}
        self._next_scan = self._next_status = -math.inf
        self._batch: list[tuple[np.ndarray, np.ndarray]] = []
        self._batched = 0
        self._logged: dict[str, float] = {}
        self._status_region: SnapshotRegion | None = None
        self._previous: dict[str, Any] | None = None  # the last status document, while opening
        self._stop_metrics: Callable[[], None] | None = None
        self._closed = False

    # -- life cycle --

    @classmethod
    def open(
        cls,
        config: ControllerConfig,
        policy: PolicyConfig | None = None,
        *,
        clock: Clock | None = None,
        initial_gears: InitialGears | None = None,
        fresh_on_corrupt_state: bool = False,
        embedded: bool = False,
    ) -> Controller:
        """Own `config.namespace` (creating it, or taking over a dead controller's segments),
        restore the state file and publish the restored gears.

        ControllerRunning names the pid of a live owner; StateError on a corrupt or
        newer-format state file unless `fresh_on_corrupt_state` (then it is set aside as
        `<file>.corrupt`, with a warning); ConfigError if metrics are asked for without
        prometheus_client.
        """
        registry = Registry.open(config.namespace, config.slots)
        try:
            registry.repair_lock()
            registry.claim_controller()
        except BaseException:
            registry.close()
            raise
        self = cls(
            config,
            policy or PolicyConfig(),
            registry,
            clock or MonotonicClock(),
            initial_gears or {},
            embedded,
        )
        try:
            self._restore(fresh_on_corrupt_state)
            if config.metrics_port is not None:
                from gearshift.controller.metrics import serve_metrics

                self._stop_metrics = serve_metrics(config.metrics_port, lambda: self.status)
        except BaseException:
            self._release()
            raise
        log.info(
            "controller pid %d owns namespace %r (state %s; %d devices restored)",
            os.getpid(),
            config.namespace,
            config.state_path,
            len(self.devices),
        )
        return self

    @classmethod
    def start_embedded(
        cls, config: ControllerConfig, policy: PolicyConfig | None = None, **options: Any
    ) -> EmbeddedController:
        """Open the controller here (errors raise in the caller, e.g. ControllerRunning) and
        run it in a daemon thread of this process: the same loop and shared memory as
        `gearshift serve`. A worker should release its slot before `stop()`, so that the
        final drain takes its ring."""
        return EmbeddedController(cls.open(config, policy, embedded=True, **options))

    def run(self, stop: threading.Event) -> None:
        """Iterate every drain interval until `stop` is set, then `close()`."""
        try:
            while not stop.is_set():
                began = self.clock.now()
                self.step()
                self.clock.sleep(self.config.drain_interval_seconds - (self.clock.now() - began))
        finally:
            self.close()

    def close(self) -> None:
        """Graceful stop (see the module docstring); idempotent."""
        if self._closed:
            return
        now = self.clock.now()
        self._guard("final scan", self._scan, now)
        for _ in range(64):  # bounded: live workers may still be producing
            before = self.counts["consumed"]
            self._guard("final drain", self._drain, now)
            if self.counts["consumed"] == before:
                break
        self._guard("state save", self._save)
        self._guard("status", self._publish_status, now)
        self._release()

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _release(self) -> None:
        """Unmap everything, release the identity, and remove the namespace if no live worker
        holds a slot (`cleanup` checks that under the namespace lock)."""
        self._closed = True
        if self._stop_metrics is not None:
            self._stop_metrics()
        for w in self.workers.values():
            if w.ring is not None:
                w.ring.close()
        for region in [*self._regions.values(), self._status_region]:
            if region is not None:
                region.close()
        self.registry.release_controller()
        self.registry.close()
        try:
            removed = cleanup(self.config.namespace)
            log.info(
                "no live worker: namespace %r removed (%d objects)",
                self.config.namespace,
                len(removed),
            )
        except (ControllerRunning, NamespaceBusy) as e:
            log.info("namespace %r kept for its workers: %s", self.config.namespace, e)

    def _restore(self, fresh_on_corrupt_state: bool) -> None:
        now = self.clock.now()
        path = self.config.state_path
        try:
            self.devices = statefile.load(path, now, self.policy)
        except StateError as e:
            if not fresh_on_corrupt_state:
                raise
            aside = path / (statefile.STATE_FILE + ".corrupt")
            os.replace(path / statefile.STATE_FILE, aside)
            log.warning("%s; starting fresh (the file is kept as %s)", e, aside)
        for device, dev in self.devices.items():
            for name in dev.profiles:
                self._key(device, name)
            if dev.profiles:
                self._publish(device, now)
        self._previous = status.read(self.config.namespace)
        self._status_region = status.open_region(self.config.namespace)
        self._scan(now)
        self._previous = None
        self._save()

    def _adopt(self, w: Worker) -> None:
        """Map the profile ids that the previous controller's last status document lists for
        this claim of the slot, so that events already in the ring are folded (on open)."""
        profiles = self.devices.get(w.info.device, DeviceLedger()).profiles
        for entry in (self._previous or {}).get("workers", []):
            if (entry["slot"], entry["generation"], entry["pid"]) == (
                w.info.slot,
                w.info.generation,
                w.info.pid,
            ):
                for local, name in entry["profiles"]:
                    if name in profiles:
                        w.map(local, self._key(w.info.device, name), name)

    # -- one iteration --

    def step(self) -> None:
        """One loop iteration at the clock's `now`, without sleeping."""
        now = self.clock.now()
        self.registry.beat_controller(int(now * 1e9))
        polling = any(now - t < ACK_POLL_SECONDS for _, t in self._awaiting.values())
        if now >= self._next_scan or polling:
            self._guard("slot scan", self._scan, now)
        self._guard("registration", self._answer, now)
        self._guard("drain", self._drain, now)
        for device in list(self.devices):
            if now >= self._next_check.get(device, -math.inf):
                self._next_check[device] = now + self.policy.check_interval_seconds
                self._guard(f"decision round of device {device}", self._decide, device, now)
        if now >= self._next_status:
            self._guard("status", self._publish_status, now)

    def _guard(self, what: str, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Exception:
            self.counts["errors"] += 1
            now = self.clock.now()
            if now - self._logged.get(what, -math.inf) >= ERROR_LOG_SECONDS:
                self._logged[what] = now
                log.exception("%s failed; the loop goes on", what)

    # -- workers --

    def _scan(self, now: float) -> None:
        self._next_scan = now + self.config.scan_interval_seconds
        claimed = set()
        for info in self.registry.slots():
            if info.state != SlotState.FREE:
                claimed.add(info.slot)
                self._guard(f"slot {info.slot}", self._track, info, now)
        for slot in set(self.workers) - claimed:  # freed behind our back (cleanup)
            self._forget(slot)
        self._acks(now)

    def _track(self, info: SlotInfo, now: float) -> None:
        """Follow a claimed slot: attach its ring; drain and reclaim it once its worker is gone."""
        w = self.workers.get(info.slot)
        if w is not None and w.info.generation != info.generation:  # claimed anew meanwhile
            self._forget(info.slot)
            w = None
        if w is None:
            w = self.workers[info.slot] = Worker(info)
            self._adopt(w)
        w.info = info
        if w.ring is None:
            w.ring = self._attach_ring(info)
        if info.reclaimable:
            self._reclaim(w, now)

    def _attach_ring(self, info: SlotInfo) -> EventRing | None:
        try:
            return EventRing.attach(self.config.namespace, info.slot)
        except FileNotFoundError:
            return None  # not created yet, or its worker died before creating it
        except LayoutError as e:
            if not info.reclaimable:
                raise
            self._discard_ring(info, e)
            return None

    def _reclaim(self, w: Worker, now: float) -> None:
        """Drain a gone worker's ring to the end, fold it, free the slot, unlink the ring."""
        if w.ring is not None:
            try:
                for _ in range(w.ring.capacity // self.config.drain_max_events + 2):
                    if not w.ring.pending():
                        break
                    self._take(w, w.ring.drain(self.config.drain_max_events), now)
            except LayoutError as e:
                w.ring.close()
                w.ring = None
                self._discard_ring(w.info, e)
            self._flush(now)
        self.registry.reclaim(w.info.slot, w.ring)
        self._forget(w.info.slot)
        self.counts["reclaimed_workers"] += 1
        log.info(
            "worker pid %d (slot %d, device %d) gone: slot reclaimed after %d events, %d dropped",
            w.info.pid,
            w.info.slot,
            w.info.device,
            w.consumed,
            w.info.dropped,
        )

    def _discard_ring(self, info: SlotInfo, error: Exception) -> None:
        log.warning(
            "slot %d: unreadable ring of gone pid %d removed: %s", info.slot, info.pid, error
        )
        segment.unlink(names.ring(self.config.namespace, info.slot))

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

    # -- registrations --

    def _answer(self, now: float) -> None:
        for slot in range(self.registry.nslots):
            try:
                message = self.registry.requests(slot).take()
                if message is None:
                    continue
                reply = self._register(slot, message, now)
            except (PayloadError, ShapeError, ProfileMismatch, NamespaceBusy) as e:
                log.warning("slot %d: registration refused: %s", slot, e)
                reply = error_reply(e)
            if not self.registry.replies(slot).post(reply):
                log.warning("slot %d has not taken its previous reply; this one is lost", slot)

    def _register(self, slot: int, message: dict, now: float) -> dict[str, Any]:
        local, name, dims = parse_register(message)
        w = self.workers.get(slot)
        if w is None or not w.info.alive:
            self._scan(now)
            w = self.workers.get(slot)
        if w is None or not w.info.alive:
            raise NamespaceBusy(f"slot {slot} is not held by a live worker")
        device = w.info.device
        dev = self.devices.setdefault(device, DeviceLedger())
        profile = dev.profiles.get(name)
        if profile is not None and list(profile.dims.items()) != list(dims.items()):
            holder = next(
                (
                    o
                    for o in self.workers.values()
                    if o is not w
                    and o.info.alive
                    and o.info.device == device
                    and name in o.profiles.values()
                ),
                None,
            )
            if holder is not None:
                raise ProfileMismatch(
                    f"profile {name!r} on device {device} is registered by pid "
                    f"{holder.info.pid} as {_describe(profile.dims)}; pid {w.info.pid} "
                    f"declares {_describe(dims)}"
                )
            log.warning(
                "profile %r on device %d re-declared as %s: its learned gears are reset",
                name,
                device,
                _describe(dims),
            )
            profile = None
        if profile is None:
            dev.profiles[name] = self._new_profile(device, name, dims, now)
            self._publish(device, now)
            self._guard("state save", self._save)
        w.map(local, self._key(device, name), name)
        self._guard("status", self._publish_status, now)  # before the reply: a successor adopts it
        log.info(
            "pid %d (slot %d) registered profile %r on device %d as id %d",
            w.info.pid,
            slot,
            name,
            device,
            local,
        )
        return {"op": "registered", "profile": local, "version": dev.version}

    def _new_profile(
        self, device: int, name: str, dims: dict[str, Dim], now: float
    ) -> ProfileLedger:
        profile = ProfileLedger.new(dims, now, self.policy)
        seeded = self.initial_gears.get(device, {}).get(name) or next(
            (p[name] for _, p in sorted(self.initial_gears.items()) if name in p), None
        )
        if seeded:
            try:
                profile.gears = starting_gears(
                    {
                        d: dataclasses.replace(dim, gears=seeded.get(d, dim.initial_gears))
                        for d, dim in dims.items()
                    },
                    now,
                )
            except ShapeError as e:
                log.warning("initial gears of %r ignored: %s", name, e)
        return profile

    def _key(self, device: int, name: str) -> int:
        key = self._keys.get((device, name))
        if key is None:
            key = self._keys[device, name] = len(self._targets)
            self._targets.append((device, name))
        return key

    # -- events --

    def _drain(self, now: float) -> None:
        for w in self.workers.values():
            if w.ring is not None:  # a ring that fails (corrupt counters) fails alone
                self._guard(f"drain of slot {w.info.slot}", self._drain_one, w, now)
        self._flush(now)

    def _drain_one(self, w: Worker, now: float) -> None:
        assert w.ring is not None
        self._take(w, w.ring.drain(self.config.drain_max_events), now)

    def _take(self, w: Worker, events: np.ndarray, now: float) -> None:
        if not len(events):
            return
        w.consumed += len(events)
        self.counts["consumed"] += len(events)
        reading = ingest.memory_reading(events)
        if reading is not None:
            w.memory = reading
        self._batch.append((events, w.keys(events)))
        self._batched += len(events)
        if self._batched >= self.config.drain_max_events:
            self._flush(now)

    def _flush(self, now: float) -> None:
        if not self._batch:
            return
        batch, self._batch, self._batched = self._batch, [], 0
        events, keys = (
            batch[0] if len(batch) == 1 else map(np.concatenate, zip(*batch, strict=True))
        )
        profiles = [self.devices[d].profiles.get(n) for d, n in self._targets]
        folded = ingest.fold(events, keys, profiles, now)
        for name in folded._fields:
            self.counts[name] += getattr(folded, name)

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

    # -- decisions and publication --

    def _decide(self, device: int, now: float) -> None:
        dev = self.devices[device]
        usage = self.memory_usage(device, now)
        began = self.clock.now()
        round = decide_round(dev, now, usage, self.policy)
        if round is None:
            return
        dev.apply(round)
        seconds = self.clock.now() - began  # the policy's part; publish and save follow
        self.round_seconds.append(seconds)
        self.rounds["count"] += 1
        self.rounds["seconds_sum"] += seconds
        self.rounds["last_seconds"] = seconds
        for name, changes in round.changes.items():
            for c in changes:
                log.info(
                    "device %d %s/%s: %s %d: %s", device, name, c.dim, c.action, c.gear, c.reason
                )
        log.debug("device %d: round (%s, memory %s) in %.1f ms", device, round.trigger, usage,
                  seconds * 1e3)
        changes = {name: [[c.dim, c.gear, c.action, c.reason] for c in cs]
                   for name, cs in round.changes.items()}
        self.changes[device] = changes
        if round.changed:
            self._publish(device, now)
        if any(changes.values()):
            self._guard("state save", self._save)

    def _publish(self, device: int, now: float) -> None:
        dev = self.devices[device]
        region = self._regions.get(device)
        if region is None:
            region = self._regions[device] = self.region_type.open(self.config.namespace, device)
        gears = {name: p.gear_lists() for name, p in dev.profiles.items()}
        payload = snapshot_payload(device, gears, self.changes.get(device))
        dev.version = region.publish(payload, at_least=dev.version + 1)
        self._awaiting[device] = (dev.version, now)
        log.info("device %d: snapshot version %d published", device, dev.version)

    def _save(self) -> None:
        statefile.save(self.config.state_path, self.devices)

    def _publish_status(self, now: float) -> None:
        self._next_status = now + self.config.status_interval_seconds
        doc = status.document(self, now)
        assert self._status_region is not None
        self._status_region.publish(doc)
        self.status = doc


class EmbeddedController:
    """A controller running in a daemon thread of a worker process (`connect(embedded=True)`)."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=controller.run, args=(self._stop,), name="gearshift-controller", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop gracefully (final drain, state saved); False if it did not end in `timeout`."""
        self._stop.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()


def _describe(dims: dict[str, Dim]) -> str:
    return ", ".join(f"{name}={dim}" for name, dim in dims.items())
