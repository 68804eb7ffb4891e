"""The demo's view of the gears: device 0's snapshot region, read as a worker reads it.

Every version seen gives the time-weighted mean gears, the adds and the evictions; a version
published and replaced between two looks is counted as missed, its changes netted into the next.
The changes' reasons tell the priced ones (measured costs decided them: `PRICED` in the reason);
the last PRICED_KEPT are kept as examples.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress

from gearshift import protocol
from gearshift.core.dims import Gears
from gearshift.shm import SnapshotRegion
from gearshift.tools.demo.workload import PROFILE

PRICED = " s of capture"  # in the reason of every priced addition (core.payback.Payback.why)
PRICED_KEPT = 3


class GearWatch:
    """One profile's gears (default: the demo's of one trace) on device 0 as the snapshot
    region publishes them."""

    def __init__(self, namespace: str, gears: Mapping[str, Gears], now: float,
                 profile: str = PROFILE) -> None:
        self.namespace, self.profile = namespace, profile
        self.gears = dict(gears)
        self.region: SnapshotRegion | None = None
        self.version = 0
        self.adds = self.evictions = self.missed = self.priced = 0
        self.priced_reasons: list[str] = []
        self.began = self.since = now
        self.area = dict.fromkeys(gears, 0.0)  # gear count x seconds

    def poll(self, now: float) -> None:
        for d, g in self.gears.items():
            self.area[d] += len(g) * (now - self.since)
        self.since = now
        if self.region is None:
            with suppress(FileNotFoundError):
                self.region = SnapshotRegion.attach(self.namespace, 0)
            if self.region is None:
                return
        if self.region.version() == self.version:
            return
        snapshot = self.region.read()
        gears = protocol.profile_gears(snapshot.payload, self.profile) if snapshot else None
        if snapshot is None or gears is None:
            return
        if self.version:
            self.missed += snapshot.version - self.version - 1
        for dim, gear, action, reason in protocol.profile_changes(snapshot.payload, self.profile):
            if action == "add" and PRICED in reason:
                self.priced += 1
                self.priced_reasons = [*self.priced_reasons, f"{dim} {gear}: {reason}"][
                    -PRICED_KEPT:]
        for d, new in gears.items():
            self.adds += len(set(new) - set(self.gears[d]))
            self.evictions += len(set(self.gears[d]) - set(new))
        self.gears, self.version = gears, snapshot.version

    def mean(self) -> dict[str, float]:
        span = self.since - self.began
        return {d: a / span if span else len(self.gears[d]) for d, a in self.area.items()}

    def close(self) -> None:
        if self.region is not None:
            self.region.close()
