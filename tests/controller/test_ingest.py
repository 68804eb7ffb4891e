from __future__ import annotations

import numpy as np

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


def test_times_are_capped_at_now() -> None:
    decode = _profile(B=Dim(max=64))
    ingest.fold(_events([(500.0, 0, (8,), Kind.SHAPE)]), np.array([0]), [decode], now=100.0)
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
