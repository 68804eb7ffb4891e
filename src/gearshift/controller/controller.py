"""The controller: the imperative shell around the pure policy, one class whose loop reads as
gunicorn's arbiter, `run` → `step` → the handlers (docs/architecture.md, "Controller").

One `step`: the controller word held (`upkeep.Leadership`); a dead holder's lock repaired (the
loop waits at most LOCK_WAIT for it; a busy scan is counted `lock_busy`, tried next iteration);
at each scan, its own objects checked by inode (`publish.Regions.check`) and the slot table
scanned (`slots`); registrations served (`registrations`); the rings drained (`ingest`,
`costbook`); the fleet (`fleet`) and the groups' rounds (`grouprounds`) ticked; the devices'
rounds started and applied (`rounds`); the state file saved (`statefile`); the status document
published (`status`). A phase that raises is counted and logged (`failures`); the loop goes on.

The slot table and registrations return effects (`effects`, data) that `_apply` matches and
applies in order: a failing `Save`, `PublishStatus`, `Measured` or `Inherit` is counted and the
list goes on; any other drops the rest of its list, and where the list ends in a `Reply` (a
registration's) the worker is refused with the error instead (a failing `Publish` of an `Added`
profile withdraws it first). So a registration's snapshot is published and saved before its
reply. Versions only increase: a device's snapshot is published at max(region version, saved
version) + 1. Graceful stop (`close`): final drain, state saved, status published, identity
released, the namespace removed unless live workers hold slots; the final save's failure is
logged, marked in the last status document (`final_save`) and raised (StateError).
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from gearshift.clock import Clock, MonotonicClock, WallClock
from gearshift.controller import (
    effects,
    fleet,
    publish,
    registrations,
    rounds,
    statefile,
    status,
    upkeep,
)
from gearshift.controller.config import ControllerConfig, InitialGears
from gearshift.controller.costbook import CostBook
from gearshift.controller.deciding import Decider
from gearshift.controller.failures import Failures
from gearshift.controller.grouprounds import GroupRounds
from gearshift.controller.ingest import Batch, ProfileKeys
from gearshift.controller.registrations import Registrations
from gearshift.controller.slots import Slots
from gearshift.core import memory
from gearshift.core.config import PolicyConfig
from gearshift.core.round import DeviceLedger, Round
from gearshift.errors import NamespaceLost, StateError
from gearshift.shm import Registry, SnapshotRegion
from gearshift.shm.cleanup import own

__all__ = ["Controller"]

log = logging.getLogger(__name__)

LOCK_WAIT = 0.005  # seconds: the longest the loop waits for the namespace lock


class Controller:
    """One namespace's controller; `open` it, then `run(stop)` or call `step()` yourself."""

    region_type: type[SnapshotRegion] = SnapshotRegion  # of the devices' snapshot regions

    def __init__(self, config: ControllerConfig, policy: PolicyConfig, registry: Registry,
                 clock: Clock, initial_gears: InitialGears, embedded: bool,
                 background_rounds: bool = True) -> None:
        self.config, self.policy, self.registry, self.clock = config, policy, registry, clock
        registry.clock = clock  # times the leases it watches (shm.lease)
        self.embedded = embedded
        self.devices: dict[int, DeviceLedger] = {}
        self.profile_keys = ProfileKeys()
        self.batch = Batch(config.drain_max_events, lambda: self.profile_keys.ledgers(self.devices))
        self.costs = CostBook()
        self.failures = Failures(clock)  # a phase's failure counted and logged; the loop goes on
        self._guard, self._failed = self.failures.guard, self.failures.failed
        self.decider = Decider(policy, clock, background_rounds, self._failed)
        self.saver = statefile.Saver(config.state_path, self.devices, self.costs,
                                     config.save_interval_seconds, clock,
                                     partial(self._failed, "state save"))
        self.slots = Slots(registry, config, self.batch)  # both return effects (`_apply`)
        self.registrations = Registrations(self.slots, self.devices, policy, initial_gears)
        self.workers, self.lags = self.slots.workers, self.slots.lags  # by slot, by device
        self.status: dict[str, Any] | None = None  # the last document published
        self.regions = publish.Regions(lambda d: self.region_type.open(config.namespace, d),
                                       lambda: status.open_region(config.namespace))
        self._next_scan = self._next_status = -math.inf
        self._previous: dict[str, Any] | None = None  # the last status document, while opening
        self._stop_metrics: Callable[[], None] | None = None
        self._state_lock: statefile.StateLock | None = None
        self._closed = False
        self._acted = False  # this iteration applied effects (`run`: not idle)
        self.final_save: str | None = None  # at close: "saved" or "failed: why"
        self.fleet = fleet.Fleet(None, "", config.fleet_key, policy, clock, clock).attach(
            self.devices, self.costs)  # "off" until `open` gives the configured one
        self.leadership = upkeep.Leadership(registry, clock, self._failed)
        self.decisions = rounds.Rounds(self.devices, policy, self.decider, self.saver, self.costs,
                                       self.slots, self._publish,
                                       lambda d, dev, now: self.fleet.prior(d, dev, now))
        self.prices, self.device_memory = self.decisions.prices, self.decisions.device_memory
        self.rounds, self.changes = self.decisions.counts, self.decisions.changes
        self.group_rounds = GroupRounds(self.registrations.groups, self.devices, policy,
                                        self._publish, self.prices, self.slots.memory_usage,
                                        self.device_memory)
        self.saver.groups = self.group_rounds  # its groups are saved with the devices

    @property
    def errors(self) -> int:
        """The phases that failed (`failures`)."""
        return self.failures.count

    # -- life cycle --

    @classmethod
    def open(cls, config: ControllerConfig, policy: PolicyConfig | None = None, *,
             clock: Clock | None = None, initial_gears: InitialGears | None = None,
             fresh_on_corrupt_state: bool = False, embedded: bool = False,
             background_rounds: bool | None = None) -> Controller:
        """Own `config.namespace` (creating it, or taking over a dead controller's segments),
        restore the state file and publish the restored gears. ControllerRunning names the pid
        of a live owner; NotOwned an object of the namespace that is another user's;
        NamespaceBusy a controller holding the same state directory; StateError on a corrupt or
        newer-format state file unless `fresh_on_corrupt_state` (then set aside as
        `<file>.corrupt`, with a warning); ConfigError if metrics are asked for without
        prometheus_client. Rounds run in threads of their own (`background_rounds`, default:
        unless a clock is injected; a fake clock's steps decide and publish inline)."""
        policy = policy or PolicyConfig()
        joining = fleet.from_config(config, policy, clock or MonotonicClock(),
                                    WallClock() if clock is None else clock)
        joining.first_read()  # before the namespace: registrations get the fleet's gears
        registry = own(config.namespace, config.slots)
        registry.wait = LOCK_WAIT
        self = cls(config, policy, registry, clock or MonotonicClock(), initial_gears or {},
                   embedded, clock is None if background_rounds is None else background_rounds)
        self.fleet = joining.attach(self.devices, self.costs)
        try:
            self._state_lock = statefile.StateLock.acquire(config.state_path)
            log.info("controller pid %d owns namespace %r (state file %s)", os.getpid(),
                     config.namespace, config.state_path / statefile.STATE_FILE)
            self._restore(fresh_on_corrupt_state)
            self.registrations.seed = self.fleet.seed
            self.fleet.restored(self.clock.now())
            if config.metrics_port is not None:
                from gearshift.controller.metrics import serve_metrics

                self._stop_metrics = serve_metrics(config.metrics_port, lambda: self.status,
                                                   config.metrics_addr)
        except BaseException:
            self._release(quiet=True)  # the refusal is the one line the caller reports
            raise
        return self

    def run(self, stop: threading.Event) -> None:
        """Iterate every drain interval until `stop` is set, then `close()`; NamespaceLost
        (logged) ends it too. While iterations find nothing to drain or answer, the wait
        between them doubles up to `idle_interval_seconds` (an idle loop's CPU), and the first
        one that does brings it back to the drain interval."""
        busy = self.config.drain_interval_seconds
        idle = max(self.config.idle_interval_seconds, busy)
        interval = busy
        try:
            while not stop.is_set():
                began, consumed = self.clock.now(), self.batch.counts["consumed"]
                self._acted = False
                self.step()
                quiet = not self._acted and self.batch.counts["consumed"] == consumed
                interval = min(2 * interval, idle) if quiet else busy
                self.clock.sleep(interval - (self.clock.now() - began))
        except NamespaceLost as e:
            log.error("%s", e)
            raise
        finally:
            self.close()

    def close(self) -> None:
        """Graceful stop (see the module docstring); idempotent. StateError, once everything
        else is done, if the final save failed."""
        if self._closed:
            return
        now = self.clock.now()
        self._guard("final scan", self._scan, now)
        for _ in range(64):  # bounded: live workers may still be producing
            before = self.batch.counts["consumed"]
            self._guard("final drain", self._drain, now)
            if self.batch.counts["consumed"] == before:
                break
        try:  # its failure is logged every time, not throttled as the loop's are
            self._save()
            self.final_save = "saved"
        except Exception as e:
            self.failures.count += 1
            self.final_save = f"failed: {type(e).__name__}: {str(e)[:200]}"
            log.error("final state save to %s failed", self.config.state_path, exc_info=e)
        self._guard("fleet", self.fleet.close, now)
        self._guard("status", self._publish_status, now)
        self._release()
        if self.final_save != "saved":
            raise StateError(f"the final state save to {self.config.state_path} "
                             f"{self.final_save}: what changed since the last save is lost")

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _release(self, quiet: bool = False) -> None:
        """Unmap everything, release the identity, and remove the namespace if no live worker
        holds a slot (`quiet`: logged at DEBUG)."""
        self._closed = True
        self.decider.close()
        self.saver.close()
        if self._stop_metrics is not None:
            self._stop_metrics()
        self.slots.close()
        self.regions.close()
        self.registry.release_controller()
        self.registry.close()
        if self._state_lock is not None:
            self._state_lock.release()
        upkeep.remove_namespace(self.config.namespace, logging.DEBUG if quiet else logging.INFO)

    def _restore(self, fresh_on_corrupt_state: bool) -> None:
        """Restore the state file, publish every restored device once, take the slots over."""
        now = self.clock.now()
        self.devices.update(statefile.restore(self.config.state_path, now, self.policy,
                                              fresh_on_corrupt_state, self.costs,
                                              self.group_rounds))
        for device, dev in self.devices.items():
            for name in dev.profiles:
                self.profile_keys.key(device, name)
            if dev.profiles:  # one that does not fit its region is said, never fatal
                self._guard(f"publish of device {device}", self._publish, device, now)
        self._previous = status.read(self.config.namespace)
        self.regions.open_status()
        self._scan(now)
        self._previous = None
        self._save()

    # -- one iteration --

    def step(self) -> None:
        """One loop iteration at the clock's `now`, without sleeping."""
        now = self.clock.now()
        self.leadership.hold(now)  # NamespaceLost if another controller took over
        self._guard("lock repair", self.leadership.repair_lock)
        if now >= self._next_scan or self.slots.polling(now):
            self._check_objects(now)
            self._guard("slot scan", self._scan, now)
        self._guard("registration", self._serve, now)
        self._guard("drain", self._drain, now)
        self._guard("fleet", self.fleet.tick, now)
        self._guard("group rounds", self.group_rounds.step, now)
        self.decisions.step(now, self._guard)
        self._guard("state save", self.saver.poll, now)
        if now >= self._next_status:
            self._guard("status", self._publish_status, now)

    def _scan(self, now: float, spare: int | None = None) -> None:
        scanned, found = self.slots.scan(now, spare)  # False: the lock was busy, try again
        self._next_scan = now + self.config.scan_interval_seconds * scanned
        self._apply(found, now)

    def _drain(self, now: float) -> None:
        self._apply(self.slots.drain(now), now)

    # -- effects and registrations --

    def _serve(self, now: float) -> None:
        """Answer every waiting registration, each slot's on its own."""
        for slot in range(self.slots.high_water()):
            self._guard(f"registration of slot {slot}", self._serve_slot, slot, now)

    def _serve_slot(self, slot: int, now: float) -> None:
        if slot not in self.slots.workers and self.registry.requests(slot).waiting():
            busy = self.slots.lock_busy  # a request may come before its slot's scan
            self._scan(now, slot)
            if slot not in self.slots.workers and self.slots.lock_busy != busy:
                return  # the lock was busy (a dead holder's, being repaired): next iteration
        taken = registrations.take(self.registry, slot, now)
        if isinstance(taken, dict):
            self._apply(self.registrations.plan(slot, taken, now), now)
        elif taken is not None:
            self._apply([taken], now)

    def _apply(self, planned: Sequence[effects.Effect], now: float) -> None:
        """Apply the `planned` effects in order (see the module docstring)."""
        self._acted = self._acted or bool(planned)
        for i, effect in enumerate(planned):
            try:
                self._apply_one(effect, now)
            except BaseException as e:
                if isinstance(effect, effects.Publish) and effect.added is not None:
                    e = self.registrations.withdraw(effect.added, e)
                reply = next((r for r in planned[i + 1:] if isinstance(r, effects.Reply)), None)
                if reply is None or not isinstance(e, Exception):
                    raise e from None
                message = registrations.failure(reply.slot, e, now)
                registrations.post(self.registry, reply.slot, message, now)
                return

    def _apply_one(self, effect: effects.Effect, now: float) -> None:
        match effect:
            case effects.Failed(what, error):
                self._failed(what, error)
            case effects.Inherit(slot):
                self._guard(f"slot {slot}", self._inherit, slot)
            case effects.Measured(slot, events, keys):
                self._guard(f"measurements of slot {slot}", self.costs.take, events, keys,
                            partial(self.profile_keys.profile, self.devices))
            case effects.Reclaim(slot):
                self._guard(f"registration of slot {slot}", self._serve_slot, slot, now)
                self._apply(self.slots.reclaim(slot, now), now)
            case effects.Publish(device):
                self._publish(device, now)
            case effects.ForgetCosts(device, name):
                self.costs.forget(device, name)
            case effects.Save():
                self._guard("state save", self._save)
            case effects.Map(slot, local, device, name):
                self.slots.workers[slot].map(local, self.profile_keys.key(device, name), name)
            case effects.PublishStatus():
                self._guard("status", self._publish_status, now)
            case effects.Log(logger, message, args):
                logging.getLogger(logger).info(message, *args)
            case effects.Reply(slot, message, version_of):
                if version_of is not None:
                    message = {**message, "version": self.devices[version_of].version}
                registrations.post(self.registry, slot, message, now)

    def _inherit(self, slot: int) -> None:
        """Map the profile ids that the previous controller's last status document lists for
        this claim of the slot, so that events already in the ring are folded (on open)."""
        w = self.slots.workers[slot]
        profiles = self.devices.get(w.info.device, DeviceLedger()).profiles
        for local, name in status.profile_ids(self._previous, w.info):
            if name in profiles:
                w.map(local, self.profile_keys.key(w.info.device, name), name)

    # -- publishing --

    @property
    def counts(self) -> dict[str, int]:
        """The event counters of the status document (a new dict: `status.counters`)."""
        return status.counters(self.batch, self.costs, self.slots, self.errors,
                               self.leadership.lock_repairs)

    def _check_objects(self, now: float) -> None:
        """`Regions.check`: NamespaceLost, or lost regions created and published again."""
        devices, status_lost = self.regions.check(self.registry)
        if status_lost:
            self._next_status = now
        for device in devices:
            self._guard(f"publish of device {device}", self._publish, device, now)

    def _publish(self, device: int, now: float, round: Round | None = None) -> None:
        """Publish the device's gears (`round`'s where it has them): `publish.snapshot`."""
        dev = self.devices[device]
        region = self.regions.device(device)
        changes = rounds.change_lists(round) if round is not None else self.changes.get(device)
        dev.version = publish.snapshot(region, device, dev.version, publish.gears(dev, round),
                                       changes, self.registrations.groups.views(device))
        self.slots.published(device, dev.version, now)
        log.info("device %d: snapshot version %d published", device, dev.version)

    def status_document(self, now: float) -> dict[str, Any]:
        """The status document at `now` (format in `status`)."""
        memory_bytes = {d: self.device_memory(d) for d in self.devices}  # the ledgers' too
        doc = status.document(
            now, namespace=self.config.namespace, embedded=self.embedded, policy=self.policy,
            counts=self.counts, rounds=self.rounds, workers=self.slots.workers.values(),
            devices=self.devices,
            memory_usage={d: self.slots.memory_usage(d, now) for d in self.devices},
            lags=self.slots.lags, changes=self.changes, costs=self.costs,
            final_save=self.final_save, unsaved_since=self.saver.unsaved_since,
            memory_bytes=memory_bytes, graph_bytes={
                d: memory.device_usage(dev, self.prices(d), self.policy)
                for d, dev in self.devices.items()})
        doc["groups"] = self.group_rounds.status()
        if self.fleet.store is not None:
            doc["fleet"] = self.fleet.view(now)
        return doc

    def _publish_status(self, now: float) -> None:
        self._next_status = now + self.config.status_interval_seconds
        assert self.regions.status is not None
        self.status = publish.status_document(self.regions.status, self.status_document(now),
                                              self.status)

    def _save(self) -> None:
        """Save now, on the loop, after any write in flight (open, new profile, close)."""
        self.saver.save_now()
