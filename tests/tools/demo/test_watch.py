"""The demo's view of the gears: the snapshot region read as a worker reads it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gearshift import protocol
from gearshift.shm import SnapshotRegion
from gearshift.tools.demo.watch import GearWatch
from gearshift.tools.demo.workload import PROFILE


@pytest.fixture
def region(namespace: str) -> Iterator[SnapshotRegion]:
    region = SnapshotRegion.create(namespace, 0)
    yield region
    region.close()
    region.unlink()


def publish(region: SnapshotRegion, seqlen: list[int], name: str = PROFILE) -> None:
    region.publish(protocol.snapshot_payload(0, {name: {"SEQLEN": seqlen}}))


def test_counts_adds_evictions_and_time_weighted_gears(
    namespace: str, region: SnapshotRegion
) -> None:
    watch = GearWatch(namespace, {"SEQLEN": (1, 2, 4)}, now=0.0)
    publish(region, [1, 2, 4])  # the registration's snapshot: nothing changed
    watch.poll(1.0)
    assert (watch.version, watch.adds, watch.evictions) == (1, 0, 0)
    publish(region, [1, 3, 4, 7])
    watch.poll(2.0)
    assert (watch.version, watch.adds, watch.evictions, watch.missed) == (2, 2, 1, 0)
    watch.poll(4.0)
    assert watch.mean() == {"SEQLEN": pytest.approx((3 + 3 + 4 + 4) / 4)}
    assert watch.gears == {"SEQLEN": (1, 3, 4, 7)}
    watch.close()


def test_a_version_skipped_between_looks_is_counted_and_its_changes_netted(
    namespace: str, region: SnapshotRegion
) -> None:
    watch = GearWatch(namespace, {"SEQLEN": (1, 2, 4)}, now=0.0)
    publish(region, [1, 2, 4])
    watch.poll(0.1)
    publish(region, [1, 2, 4, 5])
    publish(region, [1, 4, 5])
    watch.poll(0.2)
    assert (watch.version, watch.adds, watch.evictions, watch.missed) == (3, 1, 1, 1)
    watch.close()


def test_waits_for_the_region_and_follows_its_own_profile_only(namespace: str) -> None:
    watch = GearWatch(namespace, {"SEQLEN": (8,)}, now=0.0)
    watch.poll(1.0)  # no region yet
    assert watch.version == 0 and watch.mean() == {"SEQLEN": 1.0}
    region = SnapshotRegion.create(namespace, 0)
    try:
        publish(region, [2, 8], name="other")
        watch.poll(2.0)
        assert watch.version == 0 and watch.gears == {"SEQLEN": (8,)}
        other = GearWatch(namespace, {"SEQLEN": (8,)}, now=0.0, profile="other")
        other.poll(1.0)
        assert (other.version, other.gears, other.adds) == (1, {"SEQLEN": (2, 8)}, 1)
        other.close()
    finally:
        watch.close()
        region.close()
        region.unlink()


def test_counts_the_priced_additions_and_keeps_their_last_reasons(
    namespace: str, region: SnapshotRegion
) -> None:
    watch = GearWatch(namespace, {"SEQLEN": (1, 4)}, now=0.0)
    priced = "plan of 3 gears: padding -2 pts, saves 3 s over 1800 s for 1 s of capture"
    for version, gear in enumerate((2, 3, 5, 6), 1):
        changes = {PROFILE: [["SEQLEN", gear, "add", f"{priced} ({gear})"],
                             ["SEQLEN", 1, "evict", "unused"],  # not an addition
                             ["SEQLEN", 7, "add", "cover: 5 samples over 4"],  # not priced
                             ["SEQLEN", "x", "add", priced]]}  # malformed: left out
        region.publish(protocol.snapshot_payload(0, {PROFILE: {"SEQLEN": [1, 4, gear]}},
                                                 changes))
        watch.poll(float(version))
    assert watch.priced == 4
    assert watch.priced_reasons == [f"SEQLEN {g}: {priced} ({g})" for g in (3, 5, 6)]
    watch.close()
