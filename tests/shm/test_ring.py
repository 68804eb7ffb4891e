from __future__ import annotations

import itertools
import os
import random
import signal
import struct
import time
from collections import deque
from collections.abc import Iterator
from multiprocessing.context import BaseContext

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gearshift.errors import LayoutError
from gearshift.shm import EVENT_DTYPE, EventRing, Kind, names, ring
from gearshift.shm.segment import Segment
from shm.procs import WAIT, Spawn, intact, layout_table, produce, produce_forever, record


@pytest.fixture
def rings(namespace: str) -> Iterator[list[EventRing]]:
    """Rings created by the test (as workers would), unlinked and closed at the end."""
    made: list[EventRing] = []
    yield made
    for r in made:
        r.unlink()
        r.close()


def test_layout_table_matches_the_code() -> None:
    table = layout_table(ring.__doc__, capacity=1024)
    header = {"magic", "layout", "capacity", "record_size", "head", "tail", "dropped", "records"}
    assert {field: offset for field, (offset, _) in table.items() if field in header} == {
        "magic": 0,
        "layout": 8,
        "capacity": ring.CAPACITY * 8,
        "record_size": ring.RECORD_SIZE * 8,
        "head": ring.HEAD,
        "tail": ring.TAIL,
        "dropped": ring.DROPPED,
        "records": ring.RECORDS,
    }
    assert table["records"][1] == 1024 * EVENT_DTYPE.itemsize
    assert len({ring.HEAD // 64, ring.TAIL // 64, ring.DROPPED // 64, 0}) == 4  # own lines
    record = {field: row for field, row in table.items() if field not in header}
    fields = {f: (offset, dtype.itemsize) for f, (dtype, offset) in EVENT_DTYPE.fields.items()}
    assert record == {**fields, "(pad)": (56, 8)}
    assert sum(size for _, size in record.values()) == EVENT_DTYPE.itemsize == 64


def test_event_dtype_is_at_most_64_bytes_and_matches_what_put_writes(
    namespace: str, rings: list[EventRing]
) -> None:
    assert EVENT_DTYPE.itemsize <= 64
    rings.append(producer := EventRing.create(namespace, 0, 4))
    producer.put(5, 7, 9, (100, 200), (1, 3), Kind.EAGER)
    producer.put_memory(6, free=2**40, total=2**41)
    a, b = producer.drain()
    assert (a["t_ns"], a["profile"], a["version"], a["kind"], a["ndim"]) == (5, 7, 9, 2, 2)
    assert a["values"].tolist() == [100, 200, 0, 0] and a["chunks"].tolist() == [1, 3, 0, 0]
    assert (b["kind"], b["values"][0], b["values"][1]) == (Kind.MEMORY, 2**40, 2**41)


def test_write_is_put_with_packed_words_and_malformed_calls_publish_nothing(
    namespace: str, rings: list[EventRing]
) -> None:
    rings.append(producer := EventRing.create(namespace, 0, 4))
    meta, counts = ring.meta(7, 9, Kind.EAGER, 2), ring.counts((1, 3))
    assert producer.write(5, 100, -200, 0, 0, meta, counts)
    producer.put(5, 7, 9, (100, -200), (1, 3), Kind.EAGER)
    for values in ((), (1, 2, 3, 4, 5)):
        with pytest.raises(ValueError, match="1 to 4 values"):
            producer.put(6, 7, 9, values, ())
    with pytest.raises(struct.error):
        producer.write(6, 1 << 63, 0, 0, 0, meta, counts)  # does not fit the record
    assert producer.write(7, 1, 0, 0, 0, meta, counts)  # the lock was released
    a, b, c = producer.drain()
    assert a.tobytes() == b.tobytes() and c["t_ns"] == 7 and producer.dropped == 0


def test_a_measured_record_carries_gear_seconds_bytes_and_the_dim_index(
    namespace: str, rings: list[EventRing]
) -> None:
    rings.append(producer := EventRing.create(namespace, 0, 4))
    assert producer.write(5, *ring.measured(7, 9, 2, 512, 0.25, 3 << 20, 1.5e-3))
    (a,) = producer.drain()
    assert (a["t_ns"], a["profile"], a["version"], a["kind"], a["ndim"]) == (
        5, 7, 9, Kind.MEASURED, 4)
    assert a["values"].tolist() == [512, 250_000_000, 3 << 20, 1_500_000]
    assert a["chunks"].tolist() == [2, 0, 0, 0]


def test_a_closed_ring_writes_nothing_and_counts_no_drop(namespace: str) -> None:
    producer = EventRing.create(namespace, 0, 4)
    consumer = EventRing.attach(namespace, 0)
    try:
        producer.close()
        assert not producer.write(1, 1, 0, 0, 0, 0, 0) and not producer.put(1, 0, 0, (1,), (1,))
        assert consumer.pending() == 0 and consumer.dropped == 0
    finally:
        consumer.close()
        producer.unlink()


def test_capacity_must_be_a_power_of_two(namespace: str) -> None:
    with pytest.raises(ValueError, match="power of two"):
        EventRing.create(namespace, 0, 48)


@pytest.mark.parametrize(("capacity", "record_size"), [(48, 64), (64, 32), (1 << 20, 64)])
def test_a_header_describing_another_ring_shape_is_refused(
    namespace: str, capacity: int, record_size: int
) -> None:
    fake = Segment.create(names.ring(namespace, 0), ring.RECORDS + 64 * 64)
    fake.seal(ring.MAGIC, ring.LAYOUT, (capacity, record_size))
    try:
        with pytest.raises(LayoutError, match="do not fit"):
            EventRing.attach(namespace, 0)
    finally:
        fake.unlink()
        fake.close()


_ids = itertools.count()
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.integers(1, 40)),
        st.tuples(st.just("drain"), st.none() | st.integers(0, 40)),
    ),
    max_size=30,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(capacity_log2=st.integers(0, 5), ops=_ops)
def test_wraparound_and_drop_accounting_match_a_bounded_queue(
    namespace: str, capacity_log2: int, ops: list[tuple[str, int | None]]
) -> None:
    capacity, ns = 1 << capacity_log2, f"{namespace}p{next(_ids)}"
    producer = EventRing.create(ns, 0, capacity)
    consumer = EventRing.attach(ns, 0)
    model: deque[int] = deque()
    dropped = seq = 0
    try:
        for op, n in ops:
            if op == "put":
                for _ in range(n):
                    fits = len(model) < capacity
                    assert producer.put(*record(seq)) == fits
                    model.extend([seq] if fits else [])
                    dropped += not fits
                    seq += 1
            else:
                events = consumer.drain(n)
                taken = len(model) if n is None else min(len(model), n)
                expected = [model.popleft() for _ in range(taken)]
                assert events["t_ns"].tolist() == expected
                assert intact(events).all()
            assert consumer.pending() == len(model)
            assert consumer.dropped == dropped
    finally:
        producer.unlink()
        producer.close()
        consumer.close()


def test_a_corrupt_header_is_a_layout_error_not_a_misread(
    namespace: str, rings: list[EventRing]
) -> None:
    rings.append(producer := EventRing.create(namespace, 0, 8))
    producer.segment.words[ring.HEAD // 8] = 1000  # head beyond tail + capacity
    with pytest.raises(LayoutError, match="inconsistent"):
        producer.drain()


def _consume_all(consumers: list[EventRing], children: list) -> list[np.ndarray]:
    """Drain every ring until its producer exited and it is empty; return events per ring."""
    got: list[list[np.ndarray]] = [[] for _ in consumers]
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        finished = [not c.is_alive() for c in children]  # read before the final drain
        for events, consumer in zip(got, consumers, strict=True):
            events.append(consumer.drain())
        if all(finished):
            return [np.concatenate(e) for e in got]
        time.sleep(0.0005)
    raise AssertionError("producers did not finish in time")


@pytest.mark.parametrize("producers", [2, 4])
def test_producer_processes_into_one_consumer_account_for_every_event(
    namespace: str, rings: list[EventRing], spawn: Spawn, producers: int
) -> None:
    count, capacity = 60_000, 1024  # small rings, so some events are dropped
    rings.extend(EventRing.create(namespace, slot, capacity) for slot in range(producers))
    consumers = [EventRing.attach(namespace, slot) for slot in range(producers)]
    try:
        children = [spawn(produce, namespace, slot, count) for slot in range(producers)]
        per_ring = _consume_all(consumers, children)
        assert all(c.exitcode == 0 for c in children)
        for events, consumer in zip(per_ring, consumers, strict=True):
            assert len(events) + consumer.dropped == count
            assert intact(events).all()
            assert (np.diff(events["t_ns"]) > 0).all()  # in order, no duplicates
    finally:
        for consumer in consumers:
            consumer.close()


def test_a_producer_killed_at_random_points_never_leaves_a_partial_record(
    namespace: str, rings: list[EventRing], mp: BaseContext, spawn: Spawn
) -> None:
    rng = random.Random(3)
    for slot in range(8):
        rings.append(EventRing.create(namespace, slot, 256))
        consumer = EventRing.attach(namespace, slot)
        started = mp.Event()
        child = spawn(produce_forever, namespace, slot, started)
        assert started.wait(WAIT)
        batches = []
        kill_at = time.monotonic() + rng.uniform(0.0, 0.05)
        while time.monotonic() < kill_at:
            batches.append(consumer.drain())
        os.kill(child.pid, signal.SIGKILL)
        child.join(WAIT)
        batches.append(consumer.drain())
        consumer.close()
        events = np.concatenate(batches)
        assert len(events) > 0
        assert intact(events).all()
        assert (np.diff(events["t_ns"]) > 0).all()


def test_a_version_beyond_32_bits_never_spills_into_the_profile_id(namespace: str) -> None:
    ring = EventRing.create(namespace, 0, 8)
    try:
        ring.put(1, 0, (1 << 32) + 5, (7,), (1,))
        (event,) = ring.drain()
        assert (event["profile"], event["version"], event["kind"]) == (0, 5, 1)
    finally:
        ring.unlink()
        ring.close()


def test_a_capacity_beyond_the_layout_bound_is_refused(namespace: str) -> None:
    capacity = ring.MAX_CAPACITY * 2  # sparse: a ring of any size costs nothing
    fake = Segment.create(names.ring(namespace, 0), ring.RECORDS + capacity * ring.RECORD)
    fake.seal(ring.MAGIC, ring.LAYOUT, (capacity, ring.RECORD))
    try:
        with pytest.raises(LayoutError, match="do not fit"):
            EventRing.attach(namespace, 0)
    finally:
        fake.unlink()
        fake.close()
    with pytest.raises(ValueError, match="capacity"):
        EventRing.create(namespace, 0, capacity)
