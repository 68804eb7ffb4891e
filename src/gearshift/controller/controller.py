"""The controller: the imperative shell around the pure policy (docs/architecture.md, section
"Controller", describes it in full).

One iteration (`step`): heartbeat; a dead holder's namespace lock repaired (observed without
waiting; the loop waits at most LOCK_WAIT for the lock, and a scan that finds it busy is
skipped, counted `lock_busy`, and tried again next iteration); at each scan, its own objects
checked by inode (a lost control segment or lock: NamespaceLost, the loop ends; a lost snapshot
or status region: re-created and published again); the slot table (`slots.Slots`); registrations
(`registrations`), both returning effects that the loop applies in order (`effects`,
`applying`: a registration's snapshot published and saved before its reply); drain every ring
into the statistics (`ingest`) and the workers' measurements into the cost book (`costbook`);
per device, a decision round (`core.round.decide_round`, priced with the book's fits) started
on a snapshot of its ledger in a thread of its own (`deciding`; inline with an injected clock),
and each round decided since applied, with a new snapshot if a gear changed (one decided on
gears that changed meanwhile is decided again), the state file (`statefile`) saved after any
change or new measurement, at most every `save_interval_seconds` and written off the loop
(`saving`); the status document (`status`, published by `publishing`).
An exception in one phase is counted and logged (at most every 10 s per phase), and the loop
goes on.

Versions only increase: a device's snapshot is published at max(region version, saved
version) + 1, across restarts, takeovers and recreated segments; on start every restored
device is published once. Graceful stop (`close`): final drain, state saved, status published,
identity released; the namespace stays while live workers hold slots, else it is removed. The
final save's failure is logged every time (not throttled as the loop's errors are), marked in
the last status document (`final_save`) and raised (StateError) once the rest is done.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from gearshift.clock import Clock, MonotonicClock, WallClock
from gearshift.controller import fleet, rounds, saving, statefile, status, upkeep
from gearshift.controller.applying import Applying
from gearshift.controller.config import ControllerConfig, InitialGears
from gearshift.controller.costbook import CostBook
from gearshift.controller.deciding import Decided, Decider
from gearshift.controller.embedded import EmbeddedController
from gearshift.controller.grouprounds import GroupRounds
from gearshift.controller.ingest import Batch, ProfileKeys
from gearshift.controller.publishing import Publishing
from gearshift.controller.registrations import Registrations
from gearshift.controller.slots import Slots
from gearshift.core.config import PolicyConfig
from gearshift.core.round import DeviceLedger
from gearshift.errors import ControllerRunning, GearshiftError, NamespaceLost, StateError
from gearshift.shm import Registry, SnapshotRegion
from gearshift.shm.cleanup import own

__all__ = ["Controller", "EmbeddedController"]

log = logging.getLogger(__name__)

LOCK_WAIT = 0.005  # seconds: the longest the loop waits for the namespace lock


class Controller(Applying, Publishing):
    """One namespace's controller; `open` it, then `run(stop)` or call `step()` yourself."""

    region_type: type[SnapshotRegion] = SnapshotRegion  # of the devices' snapshot regions

    def __init__(self, config: ControllerConfig, policy: PolicyConfig, registry: Registry,
                 clock: Clock, initial_gears: InitialGears, embedded: bool,
                 background_rounds: bool = True) -> None:
        self.config = config
        self.policy = policy
        self.registry = registry
        registry.clock = clock  # times the leases it watches (shm.lease)
        self.clock = clock
        self.embedded = embedded
        self.devices: dict[int, DeviceLedger] = {}
        self.profile_keys = ProfileKeys()
        self.batch = Batch(config.drain_max_events, lambda: self.profile_keys.ledgers(self.devices))
        self.costs = CostBook()
        self.decider = Decider(policy, clock, background_rounds, self._failed)
        self.saver = saving.Saver(config.state_path, self.devices, self.costs,
                                  config.save_interval_seconds, clock,
                                  partial(self._failed, "state save"))
        self.slots = Slots(registry, config, self.batch)  # both return effects (`applying`)
        self.registrations = Registrations(self.slots, self.devices, policy, initial_gears)
        self.group_rounds = GroupRounds(self.registrations.groups, self.devices, policy,
                                        self._publish, self.prices, self.memory_usage,
                                        self.device_memory)
        self.workers, self.lags = self.slots.workers, self.slots.lags  # by slot, by device
        self.errors = 0  # phases that failed
        self.lock_repairs = 0  # locks released after their holder died holding them
        self.round_seconds: deque[float] = deque(maxlen=1024)
        self.rounds = {"count": 0, "seconds_sum": 0.0, "last_seconds": None}
        self.status: dict[str, Any] | None = None  # the last document published
        self.changes: dict[int, dict[str, list[list[Any]]]] = {}  # last round, per profile
        self._regions: dict[int, SnapshotRegion] = {}
        self._next_check: dict[int, float] = {}
        self._next_scan = self._next_status = -math.inf
        self._logged: dict[str, float] = {}
        self._status_region: SnapshotRegion | None = None
        self._previous: dict[str, Any] | None = None  # the last status document, while opening
        self._stop_metrics: Callable[[], None] | None = None
        self._state_lock: statefile.StateLock | None = None
        self._closed = False
        self.final_save: str | None = None  # at close: "saved" or "failed: why"
        self.fleet = fleet.Fleet(None, "", config.fleet_key, policy, clock, clock).attach(
            self.devices, self.costs)  # "off" until `open` gives the configured one
        self._usurper: tuple[int, int] | None = None  # (identity, beats) of a word not ours

    # -- life cycle --

    @classmethod
    def open(cls, config: ControllerConfig, policy: PolicyConfig | None = None, *,
             clock: Clock | None = None, initial_gears: InitialGears | None = None,
             fresh_on_corrupt_state: bool = False, embedded: bool = False,
             background_rounds: bool | None = None) -> Controller:
        """Own `config.namespace` (creating it, or taking over a dead controller's segments),
        restore the state file and publish the restored gears.

        ControllerRunning names the pid of a live owner; NotOwned an object of the namespace
        that is another user's; NamespaceBusy a controller holding the same state directory;
        StateError on a corrupt or newer-format state file unless `fresh_on_corrupt_state`
        (then it is set aside as `<file>.corrupt`, with a warning); ConfigError if metrics are
        asked for without prometheus_client. Decision rounds run in threads of their own
        (`background_rounds`, default: unless a clock is injected; a fake clock's steps decide
        and publish inline, as before).
        """
        policy = policy or PolicyConfig()
        joining = fleet.from_config(config, policy, clock or MonotonicClock(),
                                    WallClock() if clock is None else clock)
        joining.first_read()  # before the namespace: registrations get the fleet's gears
        registry = own(config.namespace, config.slots)
        registry.wait = LOCK_WAIT
        self = cls(config, policy, registry, clock or MonotonicClock(),
                   initial_gears or {}, embedded,
                   clock is None if background_rounds is None else background_rounds)
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

                self._stop_metrics = serve_metrics(
                    config.metrics_port, lambda: self.status, config.metrics_addr
                )
        except BaseException:
            self._release(quiet=True)  # the refusal is the one line the caller reports
            raise
        return self

    @classmethod
    def start_embedded(cls, config: ControllerConfig, policy: PolicyConfig | None = None,
                       **options: Any) -> EmbeddedController[Controller]:
        """Open the controller here (errors raise in the caller, e.g. ControllerRunning) and
        run it in a daemon thread of this process: the same loop and shared memory as
        `gearshift serve`. A worker should release its slot before `stop()`, so that the
        final drain takes its ring."""
        return EmbeddedController(cls.open(config, policy, embedded=True, **options))

    def run(self, stop: threading.Event) -> None:
        """Iterate every drain interval until `stop` is set, then `close()`; NamespaceLost
        (logged) ends it too."""
        try:
            while not stop.is_set():
                began = self.clock.now()
                self.step()
                self.clock.sleep(self.config.drain_interval_seconds - (self.clock.now() - began))
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
            self.errors += 1
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
        for region in [*self._regions.values(), self._status_region]:
            if region is not None:
                region.close()
        self.registry.release_controller()
        self.registry.close()
        if self._state_lock is not None:
            self._state_lock.release()
        upkeep.remove_namespace(self.config.namespace, logging.DEBUG if quiet else logging.INFO)

    def _restore(self, fresh_on_corrupt_state: bool) -> None:
        """Restore the state file, publish every restored device once, take the slots over."""
        now = self.clock.now()
        self.devices.update(statefile.restore(self.config.state_path, now, self.policy,
                                              fresh_on_corrupt_state, self.costs))
        for device, dev in self.devices.items():
            for name in dev.profiles:
                self.profile_keys.key(device, name)
            if dev.profiles:  # one that does not fit its region is said, never fatal
                self._guard(f"publish of device {device}", self._publish, device, now)
        self._previous = status.read(self.config.namespace)
        self._status_region = status.open_region(self.config.namespace)
        self._scan(now)
        self._previous = None
        self._save()

    # -- one iteration --

    def step(self) -> None:
        """One loop iteration at the clock's `now`, without sleeping."""
        now = self.clock.now()
        if not self.registry.owns_controller():
            self._taken_over()
        if self.registry.owns_controller():  # never beats another's lease
            self.registry.beat_controller(int(now * 1e9))
        self._guard("lock repair", self._repair_lock)
        if now >= self._next_scan or self.slots.polling(now):
            self._check_objects(now)
            self._guard("slot scan", self._scan, now)
        self._guard("registration", self._serve, now)
        self._guard("drain", self._drain, now)
        self._guard("fleet", self.fleet.tick, now)
        self._guard("group rounds", self.group_rounds.step, now)
        for device in list(self.devices):
            due = now >= self._next_check.get(device, -math.inf) or device in self.decider.redo
            if due and not self.decider.busy(device):
                self._next_check[device] = now + self.policy.check_interval_seconds
                self._guard(f"decision round of device {device}", self._decide, device, now)
        for decided in self.decider.finished(self.devices):
            self._guard(f"decision round of device {decided.device}", self._apply_round, decided,
                        now)
        self._guard("state save", self.saver.poll, now)
        if now >= self._next_status:
            self._guard("status", self._publish_status, now)

    def _taken_over(self) -> None:
        """The controller word no longer names this process: claim it back if it is free, names
        a dead process of this realm, or one of another realm whose lease expired while this one
        watched; another controller, beating, took over (it judged this one dead: a stop longer
        than the lease): NamespaceLost, this one stops."""
        try:
            self.registry.claim_controller()
            self._usurper = None
        except ControllerRunning as e:
            seen = (self.registry.controller().ident, self.registry.controller_beats())
            if self._usurper is None or self._usurper == seen:  # no beat seen yet: a word
                self._usurper = self._usurper or seen  # a buggy process wrote is claimed back
                return  # once its lease expired; a controller beating takes over
            raise NamespaceLost(f"namespace {self.config.namespace!r}: {e}; another controller "
                                "took the namespace over (this one was judged dead: stopped "
                                "or stalled past the lease), so this one stops") from None
        except GearshiftError as e:  # the lock busy, the namespace closed: next iteration
            self._failed("controller identity", e)

    def _scan(self, now: float, spare: int | None = None) -> None:
        scanned, effects = self.slots.scan(now, spare)  # False: the lock was busy, try again
        self._next_scan = now + self.config.scan_interval_seconds * scanned
        self._apply(effects, now)

    def _repair_lock(self) -> None:
        self.lock_repairs += upkeep.repair_lock(self.registry, self.clock)

    def _drain(self, now: float) -> None:
        self._apply(self.slots.drain(now), now)

    def memory_usage(self, device: int, now: float) -> float | None:
        """The highest fresh reading of the device's live workers (None: no fresh reading)."""
        return self.slots.memory_usage(device, now)

    def device_memory(self, device: int) -> float | None:
        """The device's memory: its workers' reading (`Slots.device_bytes`), kept in its ledger
        (a device's memory does not change; a restarted controller has it from its state file
        before any worker reads it again)."""
        dev = self.devices[device]
        dev.memory_bytes = self.slots.device_bytes(device) or dev.memory_bytes
        return dev.memory_bytes

    # -- decisions --

    def _decide(self, device: int, now: float) -> None:
        """Start the device's round on a snapshot of its ledger (`deciding`)."""
        self.device_memory(device)
        self.decider.start(device, self.devices[device], now, self.memory_usage(device, now),
                           self.prices(device), self.fleet.prior(device, self.devices[device], now))

    def _apply_round(self, decided: Decided, now: float) -> None:
        """Apply a round decided on the device's gears as they are (`Decider.finished`):
        publish if a gear changed, then the ledger."""
        device, round, usage = decided.device, decided.round, decided.usage
        dev, seconds = self.devices[device], decided.seconds
        if round is None:
            self.saver.after_round(changed=False)  # new measurements are saved all the same
            return
        if round.changed:  # PayloadError, the round not applied, if it does not fit
            self._publish(device, now, round)
        dev.apply(round)
        rounds.count(self.rounds, self.round_seconds, seconds)  # the policy's part
        rounds.log_round(device, round, usage, seconds)
        self.changes[device] = changes = rounds.change_lists(round)
        self.saver.after_round(changed=any(changes.values()))

    def _save(self) -> None:
        """Save now, on the loop, after any write in flight (open, new profile, close)."""
        self.saver.save_now()
