"""The controller's published regions (`Regions`: each device's snapshot region and the status
region, checked by inode at each scan), and publishing what fits in them.

A region's capacity is fixed when it is created (`shm.snapshot.DEFAULT_CAPACITY` for a device:
what MAX_PROFILES profiles of 4 dims of 64 gears need, even with 256-character names;
`status.CAPACITY` for the status document). What does not fit is never half-published:

- `snapshot`: the last round's changes, which only explain the gears, are left out when the
  gears alone fit; gears that do not fit raise PayloadError naming the region's limit before
  anything is written, and the caller keeps its ledger as it was (a registration is refused, a
  round is not applied). So what the controller saves always fits the region it was published
  in, and a restart publishes it again.
- `status_document`: per-gear statistics, then the devices' profiles, are left out until it
  fits (`status.shrinking`; its `truncated` says what, and a warning when that changes), never
  left stale.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gearshift.controller import status, upkeep
from gearshift.core.round import DeviceLedger, Round
from gearshift.errors import PayloadError
from gearshift.protocol import snapshot_payload
from gearshift.shm import Registry, SnapshotRegion

log = logging.getLogger(__name__)


def gears(dev: DeviceLedger, round: Round | None) -> dict[str, dict[str, list[int]]]:
    """The gears to publish for `dev`: its profiles' own, `round`'s where it has them."""
    published = {name: p.gear_lists() for name, p in dev.profiles.items()}
    if round is not None:
        published.update({name: {d: list(g.gears) for d, g in dims.items()}
                          for name, dims in round.gears.items()})
    return published


def snapshot(region: SnapshotRegion, device: int, version: int,
             gears: Mapping[str, Mapping[str, Sequence[int]]],
             changes: Mapping[str, list[list[Any]]] | None,
             groups: Mapping[str, Mapping[str, Any]] | None = None) -> int:
    """Publish `device`'s `gears` and `groups` (and `changes` when they fit too) in `region`
    as a version above `version`; returns it. PayloadError when the rest does not fit."""
    try:
        return region.publish(snapshot_payload(device, gears, changes, groups),
                              at_least=version + 1)
    except PayloadError:
        if not changes or not any(changes.values()):
            raise
    published = region.publish(snapshot_payload(device, gears, None, groups),
                               at_least=version + 1)
    log.warning("device %d: snapshot version %d leaves the last round's changes out: with them "
                "it exceeds the region's %d bytes", device, published, region.capacity)
    return published


def status_document(region: SnapshotRegion, doc: dict[str, Any],
                    before: dict[str, Any] | None = None) -> dict[str, Any]:
    """Publish `doc` in `region`, shrunk (`status.shrinking`) until it fits; returns what was
    published (a warning when it is truncated where the one `before` was not, or otherwise).
    PayloadError if even the smallest does not fit."""
    error: PayloadError | None = None
    for candidate in status.shrinking(doc, region.capacity):
        try:
            region.publish(candidate)
        except PayloadError as e:
            error = e
            continue
        truncated = candidate.get("truncated")
        if truncated != (before or {}).get("truncated"):
            log.warning("status document %s", f"truncated: {truncated}" if truncated else
                        "whole again")
        return candidate
    assert error is not None
    raise error


class Regions:
    """The regions a controller publishes in: each device's snapshot region, created (reserved
    whole) at its first use by `open_device` (SpaceError if /dev/shm has no room for it: tried
    again at the next use), and the status region (opened by `open_status`)."""

    def __init__(self, open_device: Callable[[int], SnapshotRegion],
                 open_status: Callable[[], SnapshotRegion]) -> None:
        self.devices: dict[int, SnapshotRegion] = {}
        self.status: SnapshotRegion | None = None
        self._open_device, self._open_status = open_device, open_status

    def device(self, device: int) -> SnapshotRegion:
        region = self.devices.get(device)
        if region is None:
            region = self.devices[device] = self._open_device(device)
        return region

    def open_status(self) -> None:
        self.status = self._open_status()

    def check(self, registry: Registry) -> tuple[list[int], bool]:
        """`upkeep.check`: NamespaceLost, or (the devices whose region was lost, dropped here
        for the caller to publish again; whether the status region was lost, opened again)."""
        regions: dict[object, SnapshotRegion] = {**self.devices}
        if self.status is not None:
            regions["status"] = self.status
        lost = upkeep.check(registry, regions)
        devices = [key for key in lost if isinstance(key, int)]
        for device in devices:
            del self.devices[device]
        if "status" in lost:
            self.open_status()
        return devices, "status" in lost

    def close(self) -> None:
        for region in [*self.devices.values(), self.status]:
            if region is not None:
                region.close()
