"""The devices' decision rounds as the loop drives them (`Rounds`): each device's round started
when due (`deciding.Decider`: off the loop, on a snapshot of its ledger), and each round decided
since applied (a new snapshot if a gear changed, then the ledger), counted and timed, logged, and
its changes kept as lists (`[dim, gear, action, reason]` per profile), the form the snapshot and
the status document carry."""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable
from typing import Any

from gearshift.controller.costbook import CostBook
from gearshift.controller.deciding import Decided, Decider
from gearshift.controller.slots import Slots
from gearshift.controller.statefile import Saver
from gearshift.core.config import PolicyConfig
from gearshift.core.costs import Prices
from gearshift.core.fleet import Views
from gearshift.core.round import DeviceLedger, Round

log = logging.getLogger(__name__)

Prior = dict[str, dict[str, Views]] | None  # per profile, what the fleet adds to a round


def count(rounds: dict[str, Any], recent: deque[float], seconds: float) -> None:
    """Add a round of `seconds` to `rounds` (count, seconds_sum, last_seconds) and `recent`."""
    recent.append(seconds)
    rounds["count"] += 1
    rounds["seconds_sum"] += seconds
    rounds["last_seconds"] = seconds


def change_lists(round: Round) -> dict[str, list[list[Any]]]:
    """The round's changes per profile as the snapshot and the status document carry them."""
    return {name: [[c.dim, c.gear, c.action, c.reason] for c in cs]
            for name, cs in round.changes.items()}


def log_round(device: int, round: Round, usage: float | None, seconds: float) -> None:
    """Each change at INFO, the round's trigger, memory reading and time at DEBUG."""
    for name, changes in round.changes.items():
        for c in changes:
            log.info(
                "device %d %s/%s: %s %d: %s", device, name, c.dim, c.action, c.gear, c.reason
            )
    log.debug("device %d: round (%s, memory %s) in %.1f ms", device, round.trigger, usage,
              seconds * 1e3)


class Rounds:
    """One controller's decision rounds: `counts` (count, seconds_sum, last_seconds), the
    `recent` seconds, each device's last `changes`; a round is priced with the cost book's fits
    and the profiles' live holders (`prices`) and the devices' memory (`Slots`);
    `publish(device, now, round)` publishes its gears, `prior(device, ledger, now)` is the
    fleet's prior."""

    def __init__(self, devices: dict[int, DeviceLedger], policy: PolicyConfig, decider: Decider,
                 saver: Saver, costs: CostBook, slots: Slots,
                 publish: Callable[[int, float, Round], None],
                 prior: Callable[[int, DeviceLedger, float], Prior]) -> None:
        self.devices, self.policy, self.decider, self.saver = devices, policy, decider, saver
        self.costs, self.slots, self._publish, self._prior = costs, slots, publish, prior
        self.counts: dict[str, Any] = {"count": 0, "seconds_sum": 0.0, "last_seconds": None}
        self.recent: deque[float] = deque(maxlen=1024)
        self.changes: dict[int, dict[str, list[list[Any]]]] = {}  # last round, per profile
        self._next_check: dict[int, float] = {}

    def prices(self, device: int) -> dict[str, dict[str, Prices]]:
        """Per profile of `device`, its priced dims (`CostBook.prices`, its live holders)."""
        return {name: self.costs.prices(device, name, self.slots.holders(device, name))
                for name in self.devices[device].profiles}

    def device_memory(self, device: int) -> float | None:
        """The device's memory: its workers' reading (`Slots.device_bytes`), kept in its ledger
        (a device's memory does not change; a restarted controller has it from its state file
        before any worker reads it again)."""
        dev = self.devices[device]
        dev.memory_bytes = self.slots.device_bytes(device) or dev.memory_bytes
        return dev.memory_bytes

    def step(self, now: float, guard: Callable[..., None]) -> None:
        """Start each device's round that is due (or to decide again), then apply those
        decided since, each under `guard`."""
        for device in list(self.devices):
            due = now >= self._next_check.get(device, -math.inf) or device in self.decider.redo
            if due and not self.decider.busy(device):
                self._next_check[device] = now + self.policy.check_interval_seconds
                guard(f"decision round of device {device}", self._start, device, now)
        for decided in self.decider.finished(self.devices):
            guard(f"decision round of device {decided.device}", self._apply, decided, now)

    def _start(self, device: int, now: float) -> None:
        """Start the device's round on a snapshot of its ledger (`deciding`)."""
        self.device_memory(device)
        dev = self.devices[device]
        self.decider.start(device, dev, now, self.slots.memory_usage(device, now),
                           self.prices(device), self._prior(device, dev, now))
    def _apply(self, decided: Decided, now: float) -> None:
        """Apply a round decided on the device's gears as they are (`Decider.finished`):
        publish if a gear changed, then the ledger."""
        device, round, seconds = decided.device, decided.round, decided.seconds
        if round is None:
            self.saver.after_round(changed=False)  # new measurements are saved all the same
            return
        if round.changed:  # PayloadError, the round not applied, if it does not fit
            self._publish(device, now, round)
        self.devices[device].apply(round)
        count(self.counts, self.recent, seconds)  # the policy's part
        log_round(device, round, decided.usage, seconds)
        self.changes[device] = changes = change_lists(round)
        self.saver.after_round(changed=any(changes.values()))
