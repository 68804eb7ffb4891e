"""DimStats: exact decay, hard window, bounded memory, persistence."""

from __future__ import annotations

import math

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gearshift.core.config import PolicyConfig
from gearshift.core.stats import DimStats, Histogram
from gearshift.errors import ShapeError, StateError

CFG = PolicyConfig(policy_mode="rules")  # window 300 s, half-life 150 s, slices of 10 s
LAM = math.log(2) / CFG.half_life_seconds


def direct(times: np.ndarray, values: np.ndarray, now: float, since: float) -> dict:
    """value -> (decayed weight, count, last seen) over events at or after `since`, by a loop."""
    out: dict = {}
    for t, v in zip(times.tolist(), values.tolist(), strict=True):
        if t >= since:
            w, c, last = out.get(v, (0.0, 0, -math.inf))
            out[v] = (w + math.exp(-LAM * (now - t)), c + 1, max(last, t))
    return out


def as_dict(h: Histogram) -> dict:
    return {int(v): (float(w), int(c), float(t))
            for v, w, c, t in zip(h.values, h.weights, h.counts, h.last_seen, strict=True)}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1000), st.integers(1, 50)), min_size=1, max_size=300),
       st.integers(1, 4), st.floats(0, 400))
def test_decay_is_exact_against_a_direct_sum(events, batches, ahead):
    """Any order, any batching: weights equal the direct sum over the live slices' events."""
    times = np.array([t for t, _ in events])
    values = np.array([v for _, v in events], np.int64)
    stats = DimStats(CFG)
    for part in np.array_split(np.arange(len(times)), batches):
        stats.fold(times[part], values[part])
    now = float(times.max()) + ahead
    # the window edge rounded down to a slice: the documented bound of the hard window
    edge = math.floor((now - CFG.window_seconds) / CFG.slice_seconds) * CFG.slice_seconds
    newest_slice = math.floor(times.max() / CFG.slice_seconds)
    ring = (newest_slice - math.ceil(CFG.window_seconds / CFG.slice_seconds)) * CFG.slice_seconds
    want = direct(times, values, now, since=max(edge, ring))
    got = as_dict(stats.view(now))
    assert got.keys() == want.keys()
    for v, (w, c, last) in want.items():
        assert got[v][0] == pytest.approx(w, rel=1e-12)
        assert got[v][1:] == (c, last)


def test_view_is_sorted_and_totals_add_up():
    stats = DimStats(CFG)
    stats.fold(np.array([5.0, 1.0, 3.0, 2.0]), np.array([30, 10, 30, 20]))
    h = stats.view(5.0)
    assert h.values.tolist() == [10, 20, 30]
    assert h.counts.tolist() == [1, 1, 2]
    assert h.total_count == 4
    assert h.total_weight == pytest.approx(sum(math.exp(-LAM * (5 - t)) for t in (5, 1, 3, 2)))


@pytest.mark.parametrize(("event", "now", "counted"), [
    (0.0, 299.9, True),    # inside the window
    (0.0, 305.0, True),    # 5 s past it, but in the slice [0, 10) that straddles the edge
    (0.0, 310.0, False),   # the whole slice is older than the window
    (95.0, 394.0, True),
    (95.0, 400.0, False),  # slice [90, 100) ends at the edge
])
def test_hard_window_drops_slices_wholly_older_than_the_window(event, now, counted):
    stats = DimStats(CFG)
    stats.fold(np.array([event]), np.array([7]))
    assert (stats.view(now).total_count == 1) is counted


def test_events_a_full_ring_behind_the_newest_are_ignored():
    stats = DimStats(CFG)
    stats.fold(np.array([1000.0]), np.array([5]))
    stats.fold(np.array([10.0, 999.0]), np.array([6, 5]))
    assert as_dict(stats.view(1000.0)).keys() == {5}
    assert stats.view(1000.0).total_count == 2


def test_memory_is_bounded_by_distinct_values_not_events():
    stats = DimStats(CFG)
    rng = np.random.default_rng(1)
    for step in range(200):  # 200 batches over 2000 s, 10 distinct values per 300 s era
        t = np.sort(rng.uniform(step * 10, step * 10 + 10, 5000))
        era = step * 10 // 300
        stats.fold(t, rng.integers(era * 10, era * 10 + 10, 5000))
    state = stats.to_state()
    columns = len(state["values"]) // 8
    assert columns <= 20  # the live era and at most the one before it, never 200 x 5000 events
    assert stats.entries == 31 * 10  # each slice holds its era's 10 values, no more
    assert len(state["acc"]) == stats.entries * 8
    assert set(stats.view(2000.0).values.tolist()) == set(range(50, 70))  # t >= 1700


def test_a_slice_holds_only_the_values_it_saw() -> None:
    """Memory and the saved state grow with the (slice, value) pairs seen: three slices of
    1,000 values each cost 3,000 entries, not 31 rows x 3,000 columns."""
    stats = DimStats(CFG)
    for k in range(3):
        stats.fold(np.full(1000, k * 10 + 5.0), np.arange(k * 1000, (k + 1) * 1000) + 1)
    saved = msgpack.packb(stats.to_state())
    assert len(saved) < 3000 * 40  # 16 B an entry, 16 B a column; dense: 31 x 3,000 x 16 B
    assert stats.entries == 3000
    assert stats.nbytes <= 11 * 3000 + 16 * 4096  # u16 column, f64 weight, u8 count; columns
    back = DimStats.from_state(msgpack.unpackb(saved), CFG)
    assert back.entries == 3000 and back.nbytes <= stats.nbytes
    assert as_dict(back.view(30.0)) == as_dict(stats.view(30.0))


def test_counts_too_large_for_narrow_integers_round_trip() -> None:
    stats = DimStats(CFG)
    stats.fold(np.array([1.0, 2.0]), np.array([4, 9]), np.array([1 << 40, 3]))
    state = stats.to_state()
    assert state["cnt_width"] == 8 and state["cols_width"] == 1
    back = DimStats.from_state(msgpack.unpackb(msgpack.packb(state)), CFG)
    assert back.view(2.0).counts.tolist() == [1 << 40, 3]


def test_frozen_stats_do_not_change_with_later_folds() -> None:
    stats = DimStats(CFG)
    stats.fold(np.array([1.0, 2.0, 15.0]), np.array([4, 9, 4]))
    frozen = stats.frozen()
    before = msgpack.packb(frozen.to_state())
    for t in (16.0, 200.0, 400.0, 800.0):  # into the same row, new columns, recycled rows
        stats.fold(np.array([t, t]), np.array([4, int(t)]))
    assert msgpack.packb(frozen.to_state()) == before


def test_a_snapshot_reads_as_the_stats_did_whatever_is_folded_later() -> None:
    stats = DimStats(CFG, DimStats(CFG.history()))
    stats.fold(np.array([1.0, 2.0, 15.0]), np.array([4, 9, 4]))
    snap, now = stats.snapshot(), 20.0
    assert snap.history is not None and stats.history is not None
    before, history = stats.view(now), stats.history.view(now)
    for t in (16.0, 200.0, 400.0, 800.0):  # into the same row, new columns, recycled rows
        stats.fold(np.array([t, t, t]), np.array([4, int(t), int(t) + 1]))
    for got, want in ((snap.view(now), before), (snap.history.view(now), history)):
        for field in ("values", "weights", "counts", "last_seen"):
            assert getattr(got, field).tolist() == getattr(want, field).tolist()
    assert stats.view(now).values.tolist() != before.values.tolist()  # the live ones moved


def test_an_older_dense_state_reads_back_the_same() -> None:
    stats = DimStats(CFG)
    rng = np.random.default_rng(3)
    stats.fold(rng.uniform(0, 100, 500), rng.integers(1, 40, 500))
    state, frozen = stats.to_state(), stats.frozen()
    n = len(frozen.values)
    acc, cnt = np.zeros((len(frozen.keys), n)), np.zeros((len(frozen.keys), n), np.int64)
    for i, row in enumerate(frozen.rows):
        acc[i, row.cols], cnt[i, row.cols] = row.acc, row.cnt
    dense = {k: state[k] for k in ("window_seconds", "half_life_seconds", "slice_seconds",
                                   "keys", "values", "last")}
    dense.update(acc=acc.astype("<f8").tobytes(), cnt=cnt.astype("<i8").tobytes())
    back = DimStats.from_state(dense, CFG)
    assert back.entries == stats.entries
    assert as_dict(back.view(100.0)) == as_dict(stats.view(100.0))


def test_state_round_trips_through_msgpack():
    stats = DimStats(CFG)
    stats.fold(np.array([1.0, 2.0, 30.0]), np.array([4, 9, 4]))
    packed = msgpack.packb(stats.to_state())
    back = DimStats.from_state(msgpack.unpackb(packed), CFG)
    assert as_dict(back.view(40.0)) == as_dict(stats.view(40.0))
    back.fold(np.array([41.0]), np.array([9]))
    assert back.view(41.0).counts.tolist() == [2, 2]


@pytest.mark.parametrize(("state", "message"), [
    ({"half_life_seconds": 60.0}, "half_life_seconds"),
    ({"acc": b"\0" * 3}, "malformed"),
    ({"keys": None}, "malformed"),
    ({"sizes": b"\0" * 4}, "malformed"),
    ({"cols": np.array([5], "<u4").tobytes()}, "malformed"),
    ({"cnt_width": 1, "cnt": b"\0"}, "malformed"),
    ({"cols_width": 3}, "malformed"),
    ({"values": np.array([4, 4], "<i8").tobytes(), "last": b"\0" * 16}, "two columns"),
])
def test_bad_state_is_a_state_error(state, message):
    stats = DimStats(CFG)
    stats.fold(np.array([1.0]), np.array([4]))
    with pytest.raises(StateError, match=message):
        DimStats.from_state({**stats.to_state(), **state}, CFG)


def test_fold_rejects_mismatched_arrays():
    with pytest.raises(ShapeError):
        DimStats(CFG).fold(np.array([1.0, 2.0]), np.array([3]))
    with pytest.raises(ShapeError):
        DimStats(CFG).fold(np.array([1.0, 2.0]), np.array([3, 4]), np.array([1]))


def test_counted_entries_fold_as_that_many_events():
    once, many = DimStats(CFG), DimStats(CFG)
    once.fold(np.array([5.0, 5.0, 5.0, 12.0]), np.array([7, 7, 7, 9]))
    many.fold(np.array([5.0, 12.0]), np.array([7, 9]), np.array([3, 1]))
    for (v, (w, c, t)), (v2, (w2, c2, t2)) in zip(as_dict(once.view(20.0)).items(),
                                                 as_dict(many.view(20.0)).items(), strict=True):
        assert (v, c, t) == (v2, c2, t2) and w == pytest.approx(w2, rel=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1000), st.integers(1, 50)), min_size=1, max_size=300),
       st.integers(1, 4))
def test_the_history_holds_every_event_within_a_slice_of_decay(events, batches):
    """Fed per slice and value, the history counts each event once, weighed at its slice's
    mean time in the batch: within one slice of decay of the direct sum."""
    times = np.array([t for t, _ in events])
    values = np.array([v for _, v in events], np.int64)
    config = PolicyConfig(policy_mode="rules", plan_history_seconds=1200.0)  # window 300 s
    history = DimStats(config.history())
    stats = DimStats(config, history)
    for part in np.array_split(np.arange(len(times)), batches):
        stats.fold(times[part], values[part])
    now = float(times.max())
    got = history.view(now)
    exact = DimStats(config.history())
    exact.fold(times, values)
    want = exact.view(now)
    assert got.values.tolist() == want.values.tolist()
    assert got.counts.tolist() == want.counts.tolist()
    slack = 2 ** (config.slice_seconds / config.history().half_life_seconds)
    assert ((got.weights <= want.weights * slack * (1 + 1e-9))
            & (got.weights >= want.weights / slack / (1 + 1e-9))).all()


def test_empty_histogram():
    assert DimStats(CFG).view(0.0).total_count == 0
    assert Histogram.empty().total_weight == 0.0


def test_a_recycled_ring_row_forgets_its_old_slice() -> None:
    """The row of slice 0 (an event at t=5) is reused for slice 31 (t=315): at 315 only the
    events at 100 and 315 count (mutation caught: `_claim` not zeroing a recycled row's
    weights, which gives the t=5 event full weight again)."""
    stats = DimStats(CFG)
    rows = math.ceil(CFG.window_seconds / CFG.slice_seconds) + 1
    assert math.floor(315 / CFG.slice_seconds) % rows == math.floor(5 / CFG.slice_seconds) % rows
    for t in (5.0, 100.0, 315.0):
        stats.fold(np.array([t]), np.array([7], np.int64))
    got = stats.view(315.0)
    assert got.values.tolist() == [7] and got.counts.tolist() == [2]
    assert got.weights[0] == pytest.approx(math.exp(-LAM * 215.0) + 1.0, rel=1e-12)
