from __future__ import annotations

import logging

import numpy as np
import pytest

from gearshift.controller import ingest
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim
from gearshift.core.round import ProfileLedger
from gearshift.shm import EVENT_DTYPE, Kind

CONFIG = PolicyConfig()


def _events(rows: list[tuple[float, int, tuple[int, ...], int]]) -> np.ndarray:
    """EVENT_DTYPE records from (time s, profile id, values, kind)."""
    events = np.zeros(len(rows), EVENT_DTYPE)
    for i, (t, profile, values, kind) in enumerate(rows):
        events[i]["t_ns"] = round(t * 1e9)
        events[i]["profile"] = profile
        events[i]["values"][: len(values)] = values
        events[i]["ndim"] = len(values)
        events[i]["kind"] = kind
    return events


def _profile(**dims: Dim) -> ProfileLedger:
    return ProfileLedger.new(dims, 0.0, CONFIG)


def test_samples_fold_into_their_profiles_dims_by_key() -> None:
    decode = _profile(B=Dim(max=64), S=Dim(max=4096))
    prefill = _profile(S=Dim(max=4096))
    events = _events(
        [
            (1.0, 0, (3, 700), Kind.SHAPE),
            (2.0, 1, (900,), Kind.EAGER),
            (3.0, 0, (3, 100), Kind.SHAPE),
            (4.0, 7, (5, 5), Kind.SHAPE),
        ]
    )
    keys = np.array([0, 1, 0, 1])  # record 3 carries another id that maps to prefill's key
    out = ingest.fold(events, keys, [decode, prefill], now=10.0)
    assert out == ingest.FoldCounts(folded=3, unknown=0, invalid=1)  # (5, 5) is 2 values for 1 dim
    assert decode.stats["B"].view(10.0).values.tolist() == [3]
    assert decode.stats["B"].view(10.0).counts.tolist() == [2]
    assert decode.stats["S"].view(10.0).values.tolist() == [100, 700]
    assert prefill.stats["S"].view(10.0).values.tolist() == [900]
    for profile in (decode, prefill):  # the history folds the same samples
        for dim, stats in profile.stats.items():
            past, now = profile.history[dim].view(10.0), stats.view(10.0)
            assert (past.values.tolist(), past.counts.tolist()) == (
                now.values.tolist(), now.counts.tolist())


def test_unknown_ids_out_of_bounds_values_and_odd_kinds_are_counted_not_folded() -> None:
    decode = _profile(B=Dim(min=2, max=64))
    events = _events(
        [
            (1.0, 0, (1,), Kind.SHAPE),
            (1.0, 0, (65,), Kind.SHAPE),
            (1.0, 0, (8,), Kind.SHAPE),
            (1.0, 9, (8,), Kind.SHAPE),
            (1.0, 0, (8,), 77),
            (1.0, 0, (1 << 30, 1 << 31), Kind.MEMORY),
            (1.0, 0, (8, 96, 64, 0), Kind.BUFFERS),  # the cost book's, not a sample
        ]
    )
    out = ingest.fold(events, np.array([0, 0, 0, -1, 0, 0, 0]), [decode], now=2.0)
    assert out == ingest.FoldCounts(folded=1, unknown=1, invalid=3)
    assert decode.stats["B"].view(2.0).values.tolist() == [8]


def test_a_gone_profile_counts_as_unknown() -> None:
    out = ingest.fold(_events([(1.0, 0, (8,), Kind.SHAPE)]), np.array([0]), [None], now=2.0)
    assert out == ingest.FoldCounts(folded=0, unknown=1, invalid=0)


def test_times_a_little_ahead_are_capped_at_now() -> None:
    decode = _profile(B=Dim(max=64))
    ingest.fold(_events([(150.0, 0, (8,), Kind.SHAPE)]), np.array([0]), [decode], now=100.0)
    assert decode.stats["B"].view(100.0).last_seen.tolist() == [100.0]


def test_memory_reading_is_the_last_valid_one() -> None:
    events = _events(
        [
            (1.0, 0, (25, 100), Kind.MEMORY),
            (2.0, 0, (8,), Kind.SHAPE),
            (3.0, 0, (60, 100), Kind.MEMORY),
            (4.0, 0, (5, 0), Kind.MEMORY),
        ]
    )
    assert ingest.memory_reading(events) == (3.0, 0.4, 100.0)
    assert ingest.memory_reading(events[1:2]) is None


def test_memory_reading_refuses_a_device_over_a_petabyte() -> None:
    huge = 1 << 51
    events = _events([(1.0, 0, (25, 100), Kind.MEMORY), (2.0, 0, (0, huge), Kind.MEMORY)])
    assert ingest.memory_reading(events) == (1.0, 0.75, 100.0)


def test_samples_outside_the_sane_window_are_misdated_and_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A worker clock a day behind the controller's: its samples were folded into nothing
    (decayed away), counted as folded."""
    decode = _profile(B=Dim(max=64))
    now = 200_000.0
    batch = ingest.Batch(1 << 10, lambda: [decode])
    rows = [(now - 100_000.0, 0, (8,), Kind.SHAPE), (now + 1_000.0, 0, (8,), Kind.SHAPE),
            (now - 1.0, 0, (8,), Kind.SHAPE)]
    with caplog.at_level(logging.WARNING):
        batch.add(_events(rows), np.array([0, 0, 0]), now)
        batch.flush(now)
    assert batch.counts["folded"] == 1
    assert batch.counts["misdated"] == 2 and batch.counts["invalid"] == 2
    assert "counted invalid" in caplog.text


def test_records_are_dated_in_the_controllers_clock_by_offset_or_at_drain() -> None:
    events = _events([(5.0, 0, (8,), Kind.SHAPE)])
    assert ingest.dated(events, 0.0, 9.0) is events  # one clock: as they are
    assert ingest.dated(events, 100.0, 9.0)["t_ns"].tolist() == [105_000_000_000]
    assert ingest.dated(events, None, 9.0)["t_ns"].tolist() == [9_000_000_000]
    assert events["t_ns"].tolist() == [5_000_000_000]  # the drained copy is left alone
