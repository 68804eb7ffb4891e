"""What the controller publishes: `Publishing`, a base of `Controller`.

Each device's snapshot region (created, reserved whole, at its first use) and the gears it
publishes (`publish.snapshot`: versions only increase), the status document (`status`,
`publish.status_document`) and its counters, the prices a decision round and the document use,
and the regions checked by inode at each scan (`upkeep.check`: lost ones created and published
again).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gearshift.controller import publish, rounds, status, upkeep
from gearshift.controller.config import ControllerConfig
from gearshift.controller.costbook import CostBook
from gearshift.controller.fleet import Fleet
from gearshift.controller.grouprounds import GroupRounds
from gearshift.controller.ingest import Batch
from gearshift.controller.registrations import Registrations
from gearshift.controller.slots import Slots
from gearshift.core import memory
from gearshift.core.config import PolicyConfig
from gearshift.core.costs import Prices
from gearshift.core.round import DeviceLedger, Round
from gearshift.shm import Registry, SnapshotRegion

log = logging.getLogger("gearshift.controller.controller")  # the controller's log, as before


class Publishing:
    """Publishes the controller's snapshots and status; what it uses of the controller is
    declared here and set by `Controller.__init__`."""

    region_type: type[SnapshotRegion]
    config: ControllerConfig
    policy: PolicyConfig
    registry: Registry
    embedded: bool
    devices: dict[int, DeviceLedger]
    batch: Batch
    costs: CostBook
    slots: Slots
    registrations: Registrations
    group_rounds: GroupRounds
    errors: int
    lock_repairs: int
    rounds: dict[str, Any]
    status: dict[str, Any] | None
    changes: dict[int, dict[str, list[list[Any]]]]
    final_save: str | None
    fleet: Fleet
    _regions: dict[int, SnapshotRegion]
    _status_region: SnapshotRegion | None
    _next_status: float
    _guard: Callable[..., None]
    memory_usage: Callable[[int, float], float | None]
    device_memory: Callable[[int], float | None]

    @property
    def counts(self) -> dict[str, int]:
        """The event counters of the status document (a new dict)."""
        measured = self.costs.counts
        counts = {**self.batch.counts, "reclaimed_workers": self.slots.reclaimed,
                  "exited_workers": self.slots.exited,
                  "errors": self.errors, "corrupt_slots": len(self.slots.corrupt),
                  "lock_busy": self.slots.lock_busy, "lock_repairs": self.lock_repairs,
                  "measured": measured["measured"]}
        counts["unknown"] += measured["unknown"]  # records of either kind refused
        counts["invalid"] += measured["invalid"]
        return counts

    def _check_objects(self, now: float) -> None:
        """`upkeep.check`: NamespaceLost, or lost regions created and published again."""
        regions: dict[object, SnapshotRegion] = {**self._regions}
        if self._status_region is not None:
            regions["status"] = self._status_region
        for key in upkeep.check(self.registry, regions):
            if key == "status":
                self._status_region = status.open_region(self.config.namespace)
                self._next_status = now
            else:
                del self._regions[key]
                self._guard(f"publish of device {key}", self._publish, key, now)

    def _holders(self, device: int, name: str) -> int:
        """The live workers of `device` registered with profile `name`."""
        return sum(w.info.device == device and w.info.alive and name in w.profiles.values()
                   for w in self.slots.workers.values())

    def prices(self, device: int) -> dict[str, dict[str, Prices]]:
        """Per profile of `device`, its priced dims (`CostBook.prices`, its live holders)."""
        return {name: self.costs.prices(device, name, self._holders(device, name))
                for name in self.devices[device].profiles}

    def _region(self, device: int) -> SnapshotRegion:
        """The device's snapshot region, created (reserved whole) at its first use; SpaceError
        if /dev/shm has no room for it (tried again at the next use)."""
        region = self._regions.get(device)
        if region is None:
            region = self._regions[device] = self.region_type.open(self.config.namespace, device)
        return region

    def _publish(self, device: int, now: float, round: Round | None = None) -> None:
        """Publish the device's gears (`round`'s where it has them): `publish.snapshot`."""
        dev = self.devices[device]
        region = self._region(device)
        gears = {name: p.gear_lists() for name, p in dev.profiles.items()}
        if round is not None:
            gears.update({name: {d: list(g.gears) for d, g in dims.items()}
                          for name, dims in round.gears.items()})
        changes = rounds.change_lists(round) if round is not None else self.changes.get(device)
        dev.version = publish.snapshot(region, device, dev.version, gears, changes,
                                       self.registrations.groups.views(device))
        self.slots.published(device, dev.version, now)
        log.info("device %d: snapshot version %d published", device, dev.version)

    def status_document(self, now: float) -> dict[str, Any]:
        """The status document at `now` (format in `status`)."""
        memory_bytes = {d: self.device_memory(d) for d in self.devices}  # the ledgers' too
        doc = status.document(
            now, namespace=self.config.namespace, embedded=self.embedded, policy=self.policy,
            counts=self.counts, rounds=self.rounds, workers=self.slots.workers.values(),
            devices=self.devices, memory_usage={d: self.memory_usage(d, now) for d in self.devices},
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
        assert self._status_region is not None
        self.status = publish.status_document(self._status_region, self.status_document(now),
                                              self.status)
