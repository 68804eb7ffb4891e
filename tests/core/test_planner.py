"""Plan mode, rule by rule in virtual time (whole traces: tests/tools, through the simulator)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim, padded_work
from gearshift.core.gears import Decision, DimGears
from gearshift.core.moves import Work, additions, evictions, swaps
from gearshift.core.planner import blend
from gearshift.core.policy import decide
from gearshift.core.stats import DimStats, Histogram

# Plan mode (the default); a short protection so tests can place times around it.
# The rules one by one, on a handful of events: the evidence gate (min_window_events) is off.
CFG = PolicyConfig(recent_use_protect_seconds=60.0, add_min_samples=2, min_window_events=1)
NOW = 1000.0
OLD = NOW - 250.0  # inside the window, long past the protection


def run(gears: tuple[int, ...], events: list[tuple[float, int]], config: PolicyConfig = CFG,
        dim: Dim | None = None, memory: float | None = None, created: float = 0.0,
        now: float = NOW, history: list[tuple[float, int]] | None = None,
        **state: object) -> Decision:
    """One round on a single dim "B" whose gears were created at `created` (by default long
    ago: unprotected); `history` holds the events of the history's horizon (none: no history)."""
    stats = DimStats(config)
    stats.fold(np.array([t for t, _ in events], float), np.array([v for _, v in events]))
    past = None
    if history is not None:
        longer = DimStats(config.history())
        longer.fold(np.array([t for t, _ in history], float), np.array([v for _, v in history]))
        past = {"B": longer.view(now)}
    dim = dim or Dim(gears=gears, max=100_000)
    s = DimGears(gears, dict.fromkeys(gears, created), **state)  # type: ignore[arg-type]
    return decide({"B": dim}, {"B": s}, {"B": stats.view(now)}, memory, now, config, past)


def at(t: float, value: int, times: int = 1) -> list[tuple[float, int]]:
    return [(t, value)] * times


def actions(d: Decision) -> list[tuple[str, int]]:
    return [(c.action, c.gear) for c in d.changes]


def test_addition_lands_where_it_saves_most_not_at_the_median():
    # pad samples 500 x5 and 900 x5 on 1024: rules mode's median is 700; 500 saves most.
    d = run((1024,), at(OLD, 500, 5) + at(OLD, 900, 5))
    assert actions(d)[0] == ("add", 500)
    assert d.gears["B"].gears == (500, 900, 1024)  # 900 saves 8.9% more; 1024 is kept
    assert all(c.reason.startswith("plan of 3 gears") for c in d.changes)


def test_eviction_takes_the_gear_whose_removal_adds_least_padding():
    # Dropping 200 pads one 190 up to 300 (+110); dropping 100 would pad ten 100s (+1000).
    events = at(OLD, 100, 10) + at(OLD, 190) + at(OLD, 300, 10) + at(OLD, 1000, 10)
    config = dataclasses.replace(CFG, plan_gear_keep=0.05, plan_gear_gain=0.5)
    d = run((100, 200, 300, 1000), events, config)
    assert actions(d) == [("evict", 200)]
    assert "one fewer costs 0.78% < 5.00% of the work" in d.changes[0].reason


def test_no_gear_is_added_while_it_saves_less_than_the_gain_threshold():
    events = at(OLD, 500, 5) + at(OLD, 900, 5)  # a gear at 500 saves 37% of the work
    d = run((1024,), events, dataclasses.replace(CFG, plan_gear_gain=0.4, plan_gear_keep=0.1))
    assert d.changes == ()


def test_an_evicted_gear_is_not_added_back_within_the_protection_window():
    events = at(OLD, 500, 10)
    held = run((1024,), events, evicted={500: NOW - 30.0})
    assert held.changes == ()
    later = run((1024,), events, now=NOW + 31.0, evicted={500: NOW - 30.0})
    assert ("add", 500) in actions(later)
    assert later.gears["B"].evicted == {}  # the expired entry is dropped


@pytest.mark.parametrize(("age", "kept"), [(30.0, True), (90.0, False)])
def test_a_new_gear_is_protected_for_the_window(age: float, kept: bool):
    events = at(OLD, 80) + at(OLD, 900, 20)  # dropping 100 costs 5% of the work
    config = dataclasses.replace(CFG, plan_gear_keep=0.4, plan_gear_gain=0.5)
    d = run((100, 1000), events, config, created=NOW - age)
    assert (100 in d.gears["B"].gears) == kept


@pytest.mark.parametrize(("initial", "traffic_above", "kept"),
                         [(True, False, True), (True, True, False), (False, True, True)])
def test_an_initial_gear_is_protected_only_while_traffic_stays_below_it(
        initial: bool, traffic_above: bool, kept: bool):
    # 100 serves nothing and was created just now; an added gear keeps its protection, an
    # initial one (the start-up ladder) only while no traffic has gone past it.
    events = at(OLD, 40, 20) + (at(OLD, 900, 20) if traffic_above else [])
    d = run((50, 100, 1000), events, created=NOW,
            initial=frozenset({50, 100, 1000}) if initial else frozenset())
    assert (100 in d.gears["B"].gears) == kept
    assert d.gears["B"].initial <= set(d.gears["B"].gears)


def test_unused_gears_go_and_below_all_traffic_even_while_protected():
    events = at(OLD, 10, 5) + at(OLD, 900, 5)
    d = run((2, 4, 16, 600, 1024), events, created=NOW)  # all protected
    assert [c for c in actions(d) if c[0] == "evict"] == [("evict", 2), ("evict", 4)]
    assert all("below all traffic in the window (smallest 10)" in c.reason
               for c in d.changes if c.action == "evict")
    d = run((2, 4, 16, 600, 1024), events, created=NOW - 90.0)  # protection over
    assert ("evict", 600) in actions(d)


@pytest.mark.parametrize("memory", [None, 0.95])
def test_the_largest_gear_is_never_evicted_nor_replaced(memory: float | None):
    # 1024 serves nothing and 256 covers all traffic: it stays, even when a gear must go.
    shrink = dataclasses.replace(CFG, plan_gear_keep=0.5, plan_gear_gain=0.9, plan_move_gain=0.0)
    d = run((100, 256, 1024), at(OLD, 90, 10) + at(OLD, 250, 10), shrink, memory=memory)
    assert d.gears["B"].gears[-1] == 1024 and 1024 not in [c.gear for c in d.changes]
    assert len(d.gears["B"].gears) < 3


def test_samples_over_the_largest_gear_add_a_covering_gear_at_their_max():
    dim = Dim(gears=(64,), max=4096, align=16)
    d = run((64,), at(OLD, 60, 5) + at(OLD, 90) + at(OLD, 100), dim=dim)
    assert d.changes[0].action == "add" and d.changes[0].gear == 112
    reason = d.changes[0].reason  # names the rule and states its figures (docs/policy.md)
    assert reason.startswith("cover") and all(f in reason for f in ("2 samples", "64", "100"))
    under_pressure = run((64,), at(OLD, 60, 5) + at(OLD, 90) + at(OLD, 100), dim=dim, memory=0.95)
    assert under_pressure.gears["B"].gears == (64,)


@pytest.mark.parametrize(("over", "covered"), [(2, True), (1, False)])
def test_the_cover_needs_add_min_samples_over_the_largest_gear_exactly(over: int, covered: bool):
    d = run((64,), at(OLD, 60, 5) + at(OLD, 100, over), dim=Dim(gears=(64,), max=4096))
    assert (("add", 100) in actions(d)) == covered


# 700 -> 600 saves padding on thin traffic: `n` requests of 600 against 20 of 1000, K held.
SWAP = dataclasses.replace(CFG, plan_gear_gain=0.99, plan_gear_keep=0.0)


def _swap_gain(n: int) -> tuple[float, float, float]:
    """The swap 700 -> 600's saving, its standard error and the least saving a move needs
    (`plan_move_gain` of the raw work), from the histogram the round reads."""
    stats = DimStats(SWAP)
    values = [100] * 10 + [600] * n + [1000] * 20
    stats.fold(np.full(len(values), OLD), np.array(values))
    h = stats.view(NOW)
    work = Work(h.values, h.weights, h.weights**2 / h.counts)
    gain, sd = swaps(np.array([100, 700, 1000]), np.array([1]), np.array([600]), work)
    return float(gain[0, 0]), float(sd[0, 0]), SWAP.plan_move_gain * float(h.weights @ h.values)


def _swapped(n: int, confidence: float) -> bool:
    config = dataclasses.replace(SWAP, plan_confidence=confidence)
    d = run((100, 700, 1000), at(OLD, 100, 10) + at(OLD, 600, n) + at(OLD, 1000, 20), config)
    assert actions(d) in ([], [("evict", 700), ("add", 600)]), actions(d)
    return bool(d.changes)


@pytest.mark.parametrize(("confidence", "swapped"), [(0.0, True), (1.0, False)])
def test_a_noisy_swap_waits_for_its_standard_error(confidence: float, swapped: bool):
    gain, sd, least = _swap_gain(1)  # one request of 600: 0.46 +- 0.46 pts against 0.2
    assert gain > least > gain - sd
    assert _swapped(1, confidence) == swapped


def test_reasons_say_which_way_padding_goes_and_print_no_error_wider_than_the_saving():
    config = dataclasses.replace(SWAP, plan_confidence=0.0)
    d = run((100, 700, 1000), at(OLD, 100, 10) + at(OLD, 600) + at(OLD, 1000, 20), config)
    assert [c.reason.split(": ", 1)[1] for c in d.changes] == [  # 0.46 ± 0.46: no "±"
        "moves to 600, padding down 0.46 pts (standard error 0.46 pts, as large)",
        "replaces 700, padding down 0.46 pts (standard error 0.46 pts, as large)"]
    added = run((1024,), at(OLD, 500, 5) + at(OLD, 900, 5)).changes[0].reason
    assert added.endswith("): padding down 37.43 pts")
    evicted = run((100, 990, 1000), at(OLD, 100, 10) + at(OLD, 990) + at(OLD, 1000, 20))
    assert [c.reason for c in evicted.changes] == [
        "plan of 2 gears (one fewer costs 0.05% < 1.25% of the work): padding up 0.05 pts"]


@pytest.mark.parametrize(("factor", "swapped"), [(0.99, True), (1.01, False)])
def test_a_swap_must_save_plan_move_gain_plus_plan_confidence_standard_errors(
        factor: float, swapped: bool):
    gain, sd, least = _swap_gain(2)  # at the confidence c where gain - c * sd == least
    assert _swapped(2, factor * (gain - least) / sd) == swapped


def test_memory_pressure_evicts_the_cheapest_gear_and_adds_only_in_its_place():
    events = at(OLD, 90, 10) + at(OLD, 190, 2) + at(OLD, 290, 10) + at(OLD, 700, 10)
    gears = (100, 200, 300, 1000)
    calm = run(gears, events)
    assert len(calm.gears["B"].gears) >= len(gears)
    d = run(gears, events, memory=0.95)
    assert ("evict", 200) in actions(d) and len(d.gears["B"].gears) == len(gears) - 1
    assert all(c.reason.endswith("memory pressure 0.95 >= 0.9") for c in d.changes)
    off = run(gears, events, dataclasses.replace(CFG, device_memory_usage_threshold_ratio=None),
              memory=0.95)
    assert off.changes == calm.changes


def test_moves_per_round_are_bounded():
    rng = np.random.default_rng(1)
    events = [(OLD, int(v)) for v in rng.integers(300, 4000, 400)]
    gears = (256, 512, 1024, 2048, 4096)
    for limit in (1, 2):
        d = run(gears, events, dataclasses.replace(CFG, plan_max_moves=limit))
        planned = [c.action for c in d.changes if c.reason.startswith("plan")]
        assert 0 < planned.count("add") <= limit and planned.count("evict") <= limit


def test_min_count_and_cap_hold():
    events = at(OLD, 1000, 20)
    floor = run((100, 200, 300, 1000), events, dataclasses.replace(CFG, min_gear_count_per_type=3))
    assert len(floor.gears["B"].gears) == 3
    rng = np.random.default_rng(2)
    spread = [(OLD, int(v)) for v in rng.integers(1, 4096, 500)]
    capped = run((4096,), spread, dataclasses.replace(CFG, max_gears_per_type=2))
    assert len(capped.gears["B"].gears) == 2


def test_a_quadratic_cost_spends_gears_where_padding_costs_most():
    # Uniform sizes up to 4096: counting elements, the gears spread evenly; when a chunk costs
    # ~x^2 (attention), padding long requests costs more, so the gears crowd toward the top.
    rng = np.random.default_rng(3)
    events = [(OLD, int(v)) for v in rng.integers(1, 4097, 2000)]
    config = dataclasses.replace(CFG, max_gears_per_type=3)  # one round: up to K_STEP more
    flat = run((4096,), events, config).gears["B"].gears
    steep = run((4096,), events, config, dim=Dim(gears=(4096,), max=100_000,
                                                 cost=(0.0, 1.0, 0.01))).gears["B"].gears
    assert len(flat) == len(steep) == 3 and flat[-1] == steep[-1] == 4096
    assert steep[0] > flat[0] and steep[1] > flat[1]
    assert "padding" in run((4096,), events, config).changes[0].reason


def test_protected_gears_stay_in_the_plan_whatever_the_cost():
    # Nearly all cost is quadratic: moving 100's weight up to 101 is cheap next to what the
    # cluster at 9000 saves, but 100 is protected, so the plan keeps it (no assertion fails).
    events = at(OLD, 50, 5) + at(OLD, 101, 200) + at(OLD, 9000, 200) + at(OLD, 12000, 10)
    dim = Dim(gears=(100, 14050), max=14050, cost=(0.0, 1e-12, 1e-9))
    d = run((100, 14050), events, dataclasses.replace(CFG, max_gears_per_type=3), dim=dim,
            created=NOW)
    assert d.gears["B"].gears == (100, 9000, 14050)


# 25 minutes ago a burst of 900s ran on gear 1000; the window holds only 100s and 5000s.
WINDOW = at(OLD, 100, 20) + at(OLD, 5000, 5)
BURST = at(NOW - 1500, 900, 50)


def test_the_history_keeps_a_gear_for_traffic_the_window_has_let_go():
    gears = (100, 1000, 5000)
    assert actions(run(gears, WINDOW)) == [("evict", 1000)]  # unused in the window
    d = run(gears, WINDOW, history=BURST + WINDOW)
    assert d.gears["B"].gears == (100, 900, 5000)  # placed on the history's burst
    off = dataclasses.replace(CFG, plan_history_weight=0.0)
    assert actions(run(gears, WINDOW, off, history=BURST + WINDOW)) == [("evict", 1000)]


def test_the_history_is_blended_in_at_its_weight_of_the_window():
    h = Histogram(np.array([10, 30]), np.array([2.0, 2.0]), np.array([2, 2]), np.array([5.0, 9.0]))
    past = Histogram(np.array([20, 30]), np.array([1.0, 3.0]), np.array([4, 6]),
                     np.array([1.0, 8.0]))
    b = blend(h, past, 0.5)  # the history's weight 4 is scaled to 0.5 x 4: by one half
    assert b.values.tolist() == [10, 20, 30]
    assert b.weights.tolist() == [2.0, 0.5, 3.5] and b.counts.tolist() == [2, 4, 8]
    assert b.last_seen.tolist() == [5.0, 1.0, 9.0]
    assert blend(h, past, 0.0) is h and blend(h, None, 0.5) is h


def test_the_history_does_not_hold_a_gear_the_plan_moves_nearby():
    # 1000 -> 950 and 500 -> 400: the history's traffic is the window's, served by the moves.
    events = at(OLD, 400, 20) + at(OLD, 950, 20) + at(OLD, 8000, 5)
    d = run((500, 1000, 8000), events, history=at(NOW - 1500, 950, 50) + events)
    assert d.gears["B"].gears == (400, 950, 8000)


def test_rules_mode_stays_selectable():
    events = at(OLD, 400, 5) + at(OLD, 900, 5)
    d = run((1024,), events, dataclasses.replace(CFG, policy_mode="rules"))
    assert actions(d) == [("add", 650)]  # the median of the pad samples
    assert d.gears["B"].evicted == {}


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(st.integers(1, 5000), min_size=1, max_size=60),
    gears=st.sets(st.integers(1, 5000), min_size=1, max_size=10),
    ages=st.lists(st.sampled_from([0.0, 30.0, 500.0]), min_size=10, max_size=10),
    cost=st.sampled_from([(0.0, 1.0), (1e-4, 2e-6, 1e-9), (0.0, 1e-12, 1e-9), (5, 0, 0, 1)]),
    memory=st.sampled_from([None, 0.99]),
    past=st.lists(st.integers(1, 5000), max_size=30),
)
def test_every_round_keeps_the_safety_rules(values: list[int], gears: set[int], ages: list[float],
                                            cost: tuple[float, ...], memory: float | None,
                                            past: list[int]):
    gears_t = tuple(sorted(gears))
    created = {g: NOW - age for g, age in zip(gears_t, ages, strict=False)}
    dim = Dim(gears=gears_t, max=10_000, cost=cost)
    config = dataclasses.replace(CFG, max_gears_per_type=8, min_gear_count_per_type=1)
    stats = DimStats(config)
    stats.fold(np.full(len(values), OLD), np.array(values))
    history = DimStats(config.history())
    history.fold(np.r_[np.full(len(past), NOW - 1500), np.full(len(values), OLD)],
                 np.array(past + values))
    d = decide({"B": dim}, {"B": DimGears(gears_t, created)}, {"B": stats.view(NOW)}, memory,
               NOW, config, {"B": history.view(NOW)}).gears["B"].gears
    floor = min(values)
    kept = {g for g in gears_t if NOW - created[g] < config.recent_use_protect_seconds}
    assert max(d) >= gears_t[-1]  # the largest gear is kept (the cover rule may add above)
    assert {g for g in kept if g >= floor} <= set(d)  # protection holds (step 2's floor aside)
    assert len(d) <= max(len(gears_t), config.max_gears_per_type)
    if memory is not None:
        assert len(d) <= len(gears_t)  # no growth under memory pressure


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_exact_gains_match_recomputed_padded_work(data: st.DataObject):
    g = np.array(sorted(data.draw(st.sets(st.integers(2, 200), min_size=2, max_size=8))))
    values = np.array(sorted(data.draw(st.sets(st.integers(1, int(g[-1])), min_size=1))))
    w = np.array(data.draw(st.lists(st.floats(0.01, 5.0), min_size=values.size,
                                    max_size=values.size)))
    dim = Dim(cost=(0.0, 1.0, data.draw(st.sampled_from([0.0, 0.01, 1.0]))))
    work = Work(values, w, w * w, dim.work)
    free = [x for x in range(1, int(g[-1])) if x not in g]
    if not free:
        return
    a = np.array(sorted(data.draw(st.sets(st.sampled_from(free), min_size=1, max_size=4))))
    e = np.arange(g.size)

    def cost(gears) -> float:
        return float((dim.work(padded_work(tuple(sorted(gears)), values, False)) * w).sum())

    base = cost(g)
    add, _ = additions(g, a, work)
    assert add == pytest.approx([base - cost([*g, x]) for x in a], rel=1e-9, abs=1e-6)
    loss, _ = evictions(g, e[:-1], work)  # never the largest
    assert loss == pytest.approx([cost(np.delete(g, i)) - base for i in e[:-1]], rel=1e-9,
                                 abs=1e-6)
    gain, _ = swaps(g, e[:-1], a, work)
    for i in e[:-1]:
        for j, x in enumerate(a):
            assert gain[i, j] == pytest.approx(base - cost([*np.delete(g, i), x]), rel=1e-9,
                                               abs=1e-6)
