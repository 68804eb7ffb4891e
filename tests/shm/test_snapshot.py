from __future__ import annotations

import time
from collections.abc import Iterator
from multiprocessing.context import BaseContext

import pytest

from gearshift.errors import LayoutError, PayloadError
from gearshift.shm import SnapshotRegion, names, ring, snapshot
from gearshift.shm.segment import Segment
from shm.procs import WAIT, Spawn, layout_table, publish_until, read_until, snapshot_payload

CAPACITY = 64 * 1024
RACED_VERSIONS = 20_000  # versions the writer publishes while readers read flat out


@pytest.fixture
def region(namespace: str) -> Iterator[SnapshotRegion]:
    created = SnapshotRegion.create(namespace, 0, CAPACITY)
    yield created
    created.unlink()
    created.close()


def test_layout_table_matches_the_code() -> None:
    b, B = 1, snapshot.PAYLOAD + CAPACITY  # the docstring's names
    table = layout_table(snapshot.__doc__, b=b, B=B, capacity=CAPACITY)
    buffer = snapshot.BUFFERS + b * B
    assert {field: offset for field, (offset, _) in table.items()} == {
        "magic": 0,
        "layout": 8,
        "capacity": snapshot.CAPACITY * 8,
        "state": snapshot.STATE,
        "seq[b]": buffer + snapshot.SEQ,
        "length[b]": buffer + snapshot.LENGTH,
        "crc32[b]": buffer + snapshot.CRC,
        "payload[b]": buffer + snapshot.PAYLOAD,
    }
    assert table["payload[b]"][1] == CAPACITY


def test_nothing_is_read_before_the_first_publish(region: SnapshotRegion) -> None:
    assert region.version() == 0
    assert region.read() is None


def test_versions_increase_by_one_per_publish_and_readers_see_the_latest(
    namespace: str, region: SnapshotRegion
) -> None:
    reader = SnapshotRegion.attach(namespace, 0)
    try:
        for version in range(1, 6):
            assert region.publish({"gears": list(range(version))}) == version
            assert reader.version() == version
            assert reader.read() == (version, {"gears": list(range(version))})
    finally:
        reader.close()


def test_at_least_lets_a_restarted_writer_keep_versions_increasing(
    namespace: str, region: SnapshotRegion
) -> None:
    reader = SnapshotRegion.attach(namespace, 0)
    try:
        assert region.publish({"v": 1}) == 1
        for at_least, expected in ((10, 10), (3, 11), (13, 13), (14, 14)):
            assert region.publish({"v": expected}, at_least=at_least) == expected
            assert reader.read() == (expected, {"v": expected})
        _begin_publish_and_die(region)
        assert reader.read() == (14, {"v": 14})
        assert region.publish({"v": 20}, at_least=20) == 20
        assert reader.read() == (20, {"v": 20})
    finally:
        reader.close()


def test_named_regions_work_like_device_regions(namespace: str) -> None:
    created = SnapshotRegion.create_named(names.status(namespace), 4096)
    try:
        created.publish({"format": 1})
        attached = SnapshotRegion.attach_named(names.status(namespace))
        assert (attached.capacity, attached.read()) == (4096, (1, {"format": 1}))
        attached.close()
    finally:
        created.unlink()
        created.close()


def test_an_oversized_payload_is_refused_at_publish_and_changes_nothing(
    region: SnapshotRegion,
) -> None:
    region.publish({"v": 1})
    with pytest.raises(PayloadError, match="exceeds the region's capacity"):
        region.publish({"blob": b"x" * CAPACITY})
    assert region.read() == (1, {"v": 1})


def buffer_at(region: SnapshotRegion, b: int) -> int:
    """The byte offset of buffer `b`, as the module docstring lays it out (128 + b*B, B = 64 +
    the capacity in the header)."""
    return snapshot.BUFFERS + b * (snapshot.PAYLOAD + region.segment.words[snapshot.CAPACITY])


def _begin_publish_and_die(region: SnapshotRegion) -> None:
    """Leave the region as a writer killed half-way through writing the next version."""
    words, state = region.segment.words, region.segment.words[snapshot.STATE // 8]
    other = buffer_at(region, 1 - ((state >> 1) & 1))
    words[snapshot.STATE // 8] = state | 1
    words[other // 8] = 2 * (region.version() + 1) - 1
    region.segment.mm[other + snapshot.PAYLOAD : other + snapshot.PAYLOAD + 4] = b"\xc1" * 4


def test_a_reader_starting_mid_write_gets_the_previous_good_copy(
    namespace: str, region: SnapshotRegion
) -> None:
    region.publish({"v": 1})
    region.publish({"v": 2})
    _begin_publish_and_die(region)
    reader = SnapshotRegion.attach(namespace, 0)
    try:
        assert reader.version() == 2
        assert reader.read() == (2, {"v": 2})
        writer = SnapshotRegion.attach(namespace, 0)  # a restarted controller continues
        assert writer.publish({"v": 3}) == 3
        writer.close()
        assert reader.read() == (3, {"v": 3})
    finally:
        reader.close()


def test_a_copy_whose_checksum_fails_is_never_accepted(region: SnapshotRegion) -> None:
    region.publish({"v": "good"})
    buffer = buffer_at(region, (region.segment.words[snapshot.STATE // 8] >> 1) & 1)
    region.segment.mm[buffer + snapshot.PAYLOAD + 2] ^= 0xFF  # corrupt under a stable seq
    with pytest.raises(PayloadError, match="fails its crc32"):  # at once: no retry helps
        region.read()


def test_a_length_over_the_capacity_is_refused_at_once(region: SnapshotRegion) -> None:
    region.publish({"v": "good"})
    buffer = buffer_at(region, (region.segment.words[snapshot.STATE // 8] >> 1) & 1)
    region.segment.words[(buffer + snapshot.LENGTH) // 8] = 1 << 40
    with pytest.raises(PayloadError, match="length 1099511627776 exceeds"):
        region.read()


def test_a_capacity_beyond_the_layout_bound_is_refused(namespace: str) -> None:
    capacity = snapshot.MAX_CAPACITY * 16  # sparse: a region of any size costs nothing
    fake = Segment.create(names.snapshot(namespace, 0), snapshot.BUFFERS + 2 * (64 + capacity))
    fake.seal(snapshot.MAGIC, snapshot.LAYOUT, (capacity,))
    try:
        with pytest.raises(LayoutError, match="do not fit"):
            SnapshotRegion.attach(namespace, 0)
    finally:
        fake.unlink()
        fake.close()
    with pytest.raises(ValueError, match="capacity"):
        SnapshotRegion.create(namespace, 0, capacity)


def test_versions_stay_within_what_a_ring_record_carries(region: SnapshotRegion) -> None:
    assert region.publish({}, at_least=snapshot.MAX_VERSION) == snapshot.MAX_VERSION
    with pytest.raises(PayloadError, match="version 4294967296 exceeds"):
        region.publish({})
    assert region.version() == snapshot.MAX_VERSION


@pytest.mark.parametrize(
    ("magic", "layout", "message"),
    [(ring.MAGIC, snapshot.LAYOUT, "magic"), (snapshot.MAGIC, snapshot.LAYOUT + 1, "layout")],
)
def test_attaching_another_structure_or_a_newer_layout_is_refused(
    namespace: str, magic: int, layout: int, message: str
) -> None:
    fake = Segment.create(names.snapshot(namespace, 0), 4096).seal(magic, layout, (64,))
    try:
        with pytest.raises(LayoutError, match=message):
            SnapshotRegion.attach(namespace, 0)
    finally:
        fake.unlink()
        fake.close()


def test_readers_never_accept_a_torn_payload_from_a_writer_publishing_flat_out(
    namespace: str, region: SnapshotRegion, mp: BaseContext, spawn: Spawn
) -> None:
    region.publish(snapshot_payload(1))
    start, stop, results = mp.Barrier(6), mp.Event(), mp.Queue()
    readers = [spawn(read_until, namespace, 0, start, stop, results) for _ in range(4)]
    writer = spawn(publish_until, namespace, 0, start, stop)
    start.wait(WAIT)  # all five children attached
    deadline = time.monotonic() + WAIT  # a bound on a hang, not a speed: the race is counted
    while region.version() < RACED_VERSIONS:  # the readers race the writer meanwhile
        assert time.monotonic() < deadline, f"{region.version()} versions published"
        time.sleep(0.01)
    stop.set()
    reports = [results.get(timeout=WAIT) for _ in readers]
    writer.join(WAIT)
    for accepted, torn, versions, monotonic in reports:
        assert torn == 0
        assert accepted > 0 and versions > 1 and monotonic


class _Watched:
    """A segment's mapping or words, asserting on every store into a buffer's length, crc32 or
    payload that the buffer's seq is odd at that moment (`stores` counts them)."""

    def __init__(self, inner: object, words: memoryview, itemsize: int, capacity: int) -> None:
        self.inner, self.words, self.itemsize, self.capacity = inner, words, itemsize, capacity
        self.stores = 0

    def __getitem__(self, key: object) -> object:
        return self.inner[key]

    def __len__(self) -> int:
        return len(self.inner)

    def __setitem__(self, key: int | slice, value: object) -> None:
        start = (key.start if isinstance(key, slice) else key) * self.itemsize
        size = snapshot.PAYLOAD + self.capacity
        b, at = divmod(start - snapshot.BUFFERS, size)
        if start >= snapshot.BUFFERS and at != snapshot.SEQ:
            seq = self.words[(snapshot.BUFFERS + b * size) // 8]
            assert seq % 2 == 1, f"buffer {b} written at +{at} under the even seq {seq}"
            self.stores += 1
        self.inner[key] = value


def test_a_buffer_is_written_only_while_its_seq_is_odd(region: SnapshotRegion) -> None:
    """Deterministic (no racing readers): every store into a buffer's length, crc32 or payload
    happens under an odd seq (mutation caught: `publish` not marking seq[1-b] odd first)."""
    real = region.segment
    mm = _Watched(real.mm, real.words, 1, region.capacity)
    words = _Watched(real.words, real.words, 8, region.capacity)
    proxy = type("WatchedSegment", (), {"name": real.name, "mm": mm, "words": words})()
    writer = SnapshotRegion(proxy)  # type: ignore[arg-type]
    for v in range(1, 4):  # both buffers, one of them twice
        assert writer.publish({"v": v}) == v
        assert region.read() == (v, {"v": v})
    assert mm.stores == 3 and words.stores == 6  # each publish: payload, length, crc32
