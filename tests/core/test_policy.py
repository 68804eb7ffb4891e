"""Rules mode (the original rules), rule by rule, in virtual time (one test or table per
behaviour), each threshold tested on both sides of its boundary."""

from __future__ import annotations

import dataclasses
import math
import statistics

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim
from gearshift.core.gears import Decision, DimGears, starting_gears
from gearshift.core.policy import decide, should_update
from gearshift.core.rules import gear_stats
from gearshift.core.stats import DimStats, Histogram

# Short protection so tests can place hits before or after it; additions from 2 samples.
# The rules one by one, on a handful of events: the evidence gate (min_window_events) is off.
CFG = PolicyConfig(policy_mode="rules", recent_use_protect_seconds=60.0, add_min_samples=2,
                   min_window_events=1)
NOW = 1000.0
OLD = NOW - 250.0  # inside the window, long past the protection


def hist(events: list[tuple[float, int]], now: float = NOW) -> Histogram:
    stats = DimStats(CFG)
    stats.fold(np.array([t for t, _ in events], float), np.array([v for _, v in events]))
    return stats.view(now)


def at(t: float, *values: int) -> list[tuple[float, int]]:
    return [(t, v) for v in values]


# On gears (128, 1024): pad-driven 300 (avg_pad 0.42, pressure 0.07), then split-driven 3000
# (avg_split 0.26, pressure 0.06).
TWO_CANDIDATES = at(OLD, 300, 300, 300, 3000, 3000)


def run(gears: tuple[int, ...], events: list[tuple[float, int]], config: PolicyConfig = CFG,
        dim: Dim | None = None, memory: float | None = None,
        protected: dict[int, float] | None = None, created: float = NOW) -> Decision:
    """One round on a single dim "B" whose gears were all created at `created` (by default
    now, so that only tests of eviction, which pass an old time, expose gears to it)."""
    dim = dim or Dim(gears=gears, max=100_000)
    state = DimGears(gears, dict.fromkeys(gears, created), protected or {})
    return decide({"B": dim}, {"B": state}, {"B": hist(events)}, memory, NOW, config)


def actions(d: Decision) -> list[tuple[str, int]]:
    return [(c.action, c.gear) for c in d.changes]


def stat(gears: tuple[int, ...], events: list[tuple[float, int]], gear: int):
    table = gear_stats(gears, hist(events), Dim(gears=gears, max=100_000), CFG)
    return next(s for s in table if s.gear == gear)


# --- statistics against the gear set ---------------------------------------------------------

def test_pad_and_split_samples_are_counted_apart():
    events = at(OLD, 20, 64, 80, 96)  # 20 pads on 32; 64 fits 64; 80 and 96 split on 64
    s32, s64 = stat((16, 32, 64), events, 32), stat((16, 32, 64), events, 64)
    assert (s32.pad_sample_count, s32.split_sample_count) == (1, 0)
    assert (s64.pad_sample_count, s64.split_sample_count) == (1, 2)
    assert s32.avg_pad == pytest.approx(0.375) and s32.avg_split == 0.0
    assert s64.avg_pad == 0.0  # 64 fits exactly: a pad sample with no padding
    assert s64.avg_split == pytest.approx((16 / 80 + 32 / 96) / 3)  # one denominator (original)
    assert (s64.pad_median, s64.split_median) == (64, 88)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=8, unique=True),
       st.lists(st.tuples(st.floats(NOW - 290, NOW), st.integers(1, 400)), max_size=60))
def test_gear_stats_match_a_per_event_computation(gears, events):
    gears = tuple(sorted(gears))
    table = gear_stats(gears, hist(events), Dim(gears=gears, max=400), CFG)
    lam = math.log(2) / CFG.half_life_seconds
    total = sum(math.exp(-lam * (NOW - t)) for t, _ in events)
    for i, s in enumerate(table):
        top = i == len(gears) - 1
        mine = [(math.exp(-lam * (NOW - t)), r, t) for t, r in events
                if (r <= s.gear and (i == 0 or r > gears[i - 1])) or (top and r > s.gear)]
        weight = sum(w for w, _, _ in mine)
        pads = [r for _, r, _ in mine if r <= s.gear]
        splits = [r for _, r, _ in mine if r > s.gear]
        assert (s.pad_sample_count, s.split_sample_count) == (len(pads), len(splits))
        assert s.hit_rate == pytest.approx(weight / total if total else 0.0)
        pad = sum(w * (s.gear - r) / s.gear for w, r, _ in mine if r <= s.gear)
        split = sum(w * (r - s.gear) / r for w, r, _ in mine if r > s.gear)
        assert s.avg_pad == pytest.approx(pad / weight if mine else 0.0)
        assert s.avg_split == pytest.approx(split / weight if mine else 0.0)
        assert s.pad_median == (statistics.median(pads) if pads else None)
        assert s.split_median == (statistics.median(splits) if splits else None)
        assert s.last_hit == (max(t for _, _, t in mine) if mine else None)
        if not top:
            nxt = gears[i + 1]
            loss = sum(w * (nxt - r) / nxt for w, r, _ in mine)
            assert s.replace_loss == pytest.approx(loss / weight if mine else 0.0)
        assert s.score == pytest.approx(0.6 * s.hit_rate - 0.2 * s.avg_pad - 0.2 * s.avg_split)


def test_two_dims_keep_separate_stats_additions_and_evictions():
    dims = {"B": Dim(gears=(8, 16, 64), max=64), "S": Dim(gears=(128, 1024), max=4096)}
    states = starting_gears(dims, 0.0)
    stats = {"B": hist(at(OLD, 8, 8, 64, 64)),  # 16 unused: evicted; nothing to add
             "S": hist(TWO_CANDIDATES)}  # 128 unused: evicted; 300 and 3000 added
    d = decide(dims, states, stats, None, NOW, CFG)
    assert [(c.dim, c.action, c.gear) for c in d.changes] == [
        ("B", "evict", 16), ("S", "evict", 128), ("S", "add", 300), ("S", "add", 3000)]
    assert d.gears["B"].gears == (8, 64)
    assert d.gears["S"].gears == (300, 1024, 3000)


# --- eviction ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("last_hit_age", "evicted"), [(10.0, 8), (59.0, 8), (60.0, 16)])
def test_a_recent_hit_protects(last_hit_age, evicted):
    """8 is hit often but long ago; 16 once, `last_hit_age` seconds ago (protection 60 s):
    16 has the lower score, so it goes unless its recent hit protects it."""
    events = at(OLD, 8, 8, 8, 8, 32, 32) + at(NOW - last_hit_age, 16)
    assert actions(run((8, 16, 32), events, created=0.0)) == [("evict", evicted)]


@pytest.mark.parametrize(("age", "evicted"), [(0.0, []), (299.0, []), (300.0, [("evict", 16)])])
def test_a_new_zero_use_gear_is_protected_for_the_window(age, evicted):
    # recent-use protection 300 s = the window
    config = PolicyConfig(policy_mode="rules", min_window_events=1)
    state = DimGears((16, 64), {16: NOW - age, 64: 0.0})
    d = decide({"B": Dim(gears=(16, 64))}, {"B": state}, {"B": hist(at(OLD, 60, 60))}, None,
               NOW, config)
    assert actions(d) == evicted


def test_zero_use_gears_go_first():
    events = at(OLD, 17, *[64] * 10)  # 32 is used rarely and badly: lowest score; 16 unused
    table = {s.gear: s for s in gear_stats((16, 32, 64), hist(events), Dim(), CFG)}
    assert table[32].score < table[16].score == 0.0
    config = dataclasses.replace(CFG, replace_loss_threshold=1.0)
    assert actions(run((16, 32, 64), events, config, created=0.0)) == [("evict", 16)]


def test_a_low_value_gear_is_evicted():
    """The reference's case: 16 has one padded hit, 8 and 32 are hit without padding."""
    config = dataclasses.replace(CFG, replace_loss_threshold=1.0, min_gear_count_per_type=2)
    d = run((8, 16, 32), at(OLD, 8, 8, 10, 32), config, created=0.0)
    assert actions(d) == [("evict", 16)]
    assert d.changes[0].reason.startswith("lowest score 0.075")
    assert d.gears["B"].gears == (8, 32)


@pytest.mark.parametrize("gears", [(64,), (32, 64)])
def test_the_largest_gear_is_never_evicted(gears):
    d = run(gears, at(OLD, 20, 30, 30), dataclasses.replace(CFG, replace_loss_threshold=1.0),
            created=0.0)
    assert 64 in d.gears["B"].gears
    assert ("evict", 64) not in actions(d)


@pytest.mark.parametrize(("minimum", "evicted"), [(3, []), (2, [("evict", 16)])])
def test_min_gear_count_holds(minimum, evicted):
    config = dataclasses.replace(CFG, min_gear_count_per_type=minimum)
    assert actions(run((8, 16, 32), at(OLD, 8, 32), config, created=0.0)) == evicted


def test_at_most_one_eviction_per_dim_per_round():
    d = run((8, 16, 32, 64, 128), at(OLD, 128, 128), created=0.0)
    assert actions(d) == [("evict", 64)]  # all four are unused: the largest of them goes first
    assert len(d.gears["B"].gears) == 4


def test_replacement_loss_blocks_eviction_and_extends_protection():
    """8 carries its traffic alone: without it, 8s pad to 64 (loss 0.875 > 0.6)."""
    events = at(OLD, 8, 8, 8, 8, 8, 8)
    d = run((8, 64), events, created=0.0)
    assert actions(d) == [("protect", 8)]
    assert d.gears["B"].gears == (8, 64)
    assert d.gears["B"].protected_until == {8: NOW + 60.0}
    assert "replacement loss 0.88 > 0.6" in d.changes[0].reason
    assert not d.changed
    # the protection holds the next round, and no new "protect" is emitted while it does
    again = decide({"B": Dim(gears=(8, 64))}, d.gears, {"B": hist(events, NOW + 30)}, None,
                   NOW + 30, CFG)
    assert again.changes == ()
    assert again.gears["B"].protected_until == {8: NOW + 60.0}


@pytest.mark.parametrize(("threshold", "action"), [(0.5, "evict"), (0.4999, "protect")])
def test_a_replacement_loss_equal_to_the_threshold_does_not_block(threshold, action):
    """Without 4, its samples (all 4s) pad to 8: loss exactly 0.5. Only a loss over the
    threshold blocks the eviction (docs/policy.md: strictly greater)."""
    config = dataclasses.replace(CFG, replace_loss_threshold=threshold)
    d = run((4, 8), at(OLD, 4, 4, 4, 8), config, created=0.0)
    assert stat((4, 8), at(OLD, 4, 4, 4, 8), 4).replace_loss == 0.5
    assert actions(d) == [(action, 4)]
    assert d.gears["B"].gears == ((8,) if action == "evict" else (4, 8))


def test_expired_protection_is_dropped_and_the_gear_is_evictable_again():
    config = dataclasses.replace(CFG, replace_loss_threshold=1.0)
    d = run((8, 64), at(OLD, 64, 64), config, protected={8: NOW - 1.0}, created=0.0)
    assert actions(d) == [("evict", 8)]
    assert d.gears["B"].protected_until == {}


# --- addition ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("raws", "align", "added"), [
    ((40, 41, 50, 50, 60), 1, 50),  # odd count: the middle sample
    ((40, 41, 50, 60), 1, 46),  # even count: mean of the two middle ones (45.5), rounded up
    ((33, 40, 41, 44, 60), 8, 48),  # 41 aligned up to 48
    ((40, 41, 50, 50, 60), 128, 128),  # aligned up to 128, which exists: nothing is added
])
def test_pad_driven_addition_lands_on_the_median(raws, align, added):
    dim = Dim(gears=(32, 128), max=256, align=align)
    d = run((32, 128), at(OLD, *raws), dim=dim)
    assert actions(d) == ([] if added == 128 else [("add", added)])


def test_pad_driven_addition_needs_both_samples_and_padding():
    assert actions(run((64,), at(OLD, 40))) == []  # one sample < add_min_samples 2
    assert actions(run((64,), at(OLD, 50, 50))) == []  # avg_pad 0.22 < 0.35


@pytest.mark.parametrize(("samples", "added"), [(5, [("add", 40)]), (4, [])])
def test_pad_driven_addition_needs_add_min_samples_pad_samples_exactly(samples, added):
    """add_min_samples (5) pad samples are enough, one fewer is not (avg_pad 0.375)."""
    config = dataclasses.replace(CFG, add_min_samples=5)
    assert actions(run((64,), at(OLD, *[40] * samples), config)) == added


@pytest.mark.parametrize(("samples", "added"), [(5, [("add", 100)]), (4, [])])
def test_split_driven_addition_needs_add_min_samples_split_samples_exactly(samples, added):
    """add_min_samples (5) split samples over the largest gear are enough, one fewer is not
    (avg_split 0.36); the pad samples of the largest gear do not count toward them."""
    config = dataclasses.replace(CFG, add_min_samples=5)
    events = at(OLD, *[100] * samples) + at(OLD, 64, 64)
    assert stat((32, 64), events, 64).pad_sample_count == 2
    assert actions(run((32, 64), events, config)) == added


@pytest.mark.parametrize("splittable", [True, False])
def test_split_driven_addition_comes_only_from_the_largest_gear(splittable):
    """Split (chunked) and eager runs both feed it; 32 pads heavily but has no split samples."""
    dim = Dim(gears=(32, 64), max=256, splittable=splittable)
    events = at(OLD, 100, 110, 120, 200) + at(OLD, 33, 64, 64)
    table = {s.gear: s for s in gear_stats((32, 64), hist(events), dim, CFG)}
    assert table[32].split_sample_count == 0 and table[64].split_sample_count == 4
    d = run((32, 64), events, dim=dim)
    assert actions(d) == [("add", 115)]
    assert d.changes[0].reason.startswith("split-driven from largest gear 64: avg_split 0.27")


def test_additions_go_in_pressure_order_and_the_cap_holds():
    assert actions(run((128, 1024), TWO_CANDIDATES)) == [("add", 300), ("add", 3000)]
    config = dataclasses.replace(CFG, max_gears_per_type=3)
    assert actions(run((128, 1024), TWO_CANDIDATES, config)) == [("add", 300)]
    full = dataclasses.replace(CFG, max_gears_per_type=2)
    assert actions(run((128, 1024), TWO_CANDIDATES, full)) == []


def test_duplicates_are_filtered():
    """Both 96 and 128's pad samples align to existing gears or to one another."""
    dim = Dim(gears=(64, 96, 128), max=256, align=32)
    events = at(OLD, 65, 66, 97, 98)  # medians 65.5 -> 96 (exists), 97.5 -> 128 (exists)
    assert actions(run((64, 96, 128), events, dim=dim)) == []
    dim = Dim(gears=(64, 256), max=256, align=64)
    events = at(OLD, 130, 131, 300 - 100, 190)  # one pad candidate: 160.5 -> 192
    assert actions(run((64, 256), events, dim=dim)) == [("add", 192)]


# --- memory pressure --------------------------------------------------------------------------

@pytest.mark.parametrize(("last", "now", "usage", "threshold", "why"), [
    (None, 0.0, None, 0.9, "interval"),
    (0.0, 299.0, None, 0.9, None),
    (0.0, 300.0, None, 0.9, "interval"),
    (0.0, 60.0, 0.89, 0.9, None),
    (0.0, 60.0, 0.90, 0.9, "memory"),  # pressure triggers before the interval
    (0.0, 60.0, 0.99, None, None),  # a None threshold disables memory checks
    (0.0, 300.0, 0.99, None, "interval"),
])
def test_should_update(last, now, usage, threshold, why):
    config = PolicyConfig(policy_mode="rules", device_memory_usage_threshold_ratio=threshold,
                          min_window_events=1)
    assert should_update(last, now, usage, config) == why


def test_memory_pressure_turns_additions_into_replacements():
    assert actions(run((128, 1024), TWO_CANDIDATES, memory=0.95)) == []  # no eviction: no room
    events = TWO_CANDIDATES + at(NOW - 10, 128)  # 128 recently hit; 16 unused and evictable
    d = run((16, 128, 1024), events, memory=0.95, created=0.0)
    assert actions(d) == [("evict", 16), ("add", 300)]
    assert "replaces an eviction under memory pressure 0.95 >= 0.9" in d.changes[1].reason
    assert actions(run((16, 128, 1024), events, memory=0.89, created=0.0)) == [
        ("evict", 16), ("add", 300), ("add", 3000)]


def test_a_none_threshold_disables_memory_checks():
    config = dataclasses.replace(CFG, device_memory_usage_threshold_ratio=None)
    assert actions(run((128, 1024), TWO_CANDIDATES, config, memory=0.99)) == [
        ("add", 300), ("add", 3000)]


# --- state ------------------------------------------------------------------------------------

def test_state_bookkeeping():
    dims = {"B": Dim(gears=(16, 64), max=512)}
    states = starting_gears(dims, 5.0)
    assert states == {"B": DimGears((16, 64), {16: 5.0, 64: 5.0}, {}, initial=frozenset({16, 64}))}
    d = decide(dims, states, {"B": hist(at(OLD, 300, 300, 400))}, None, NOW, CFG)
    assert actions(d) == [("evict", 16), ("add", 300)]
    assert d.gears["B"] == DimGears((64, 300), {64: 5.0, 300: NOW}, {}, initial=frozenset({64}))
    assert d.changed


def test_no_traffic_no_change():
    dims = {"B": Dim(gears=(16, 64))}
    d = decide(dims, starting_gears(dims, NOW), {}, None, NOW, CFG)
    assert d.changes == () and not d.changed
