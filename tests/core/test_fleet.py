"""The fleet's pure part: the key, the compact statistics, the merge, the prior and its decay,
the start-up gears."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gearshift.core.config import PolicyConfig
from gearshift.core.costs import Measurement
from gearshift.core.dims import Dim
from gearshift.core.fleet import (
    Compact,
    FleetKey,
    Member,
    disagreement,
    fleet_costs,
    fleet_gears,
    merged,
    primed,
    prior_of,
    prior_weight,
    scaled,
)
from gearshift.core.round import DeviceLedger, ProfileLedger, decide_round
from gearshift.core.stats import DimStats
from gearshift.errors import ShapeError

CONFIG = PolicyConfig()
DIMS = {"S": Dim(max=2048)}


def _stats(values: np.ndarray, times: np.ndarray) -> DimStats:
    s = DimStats(CONFIG, DimStats(CONFIG.history()))
    s.fold(times, values)
    return s


def _member(node: str, values: list[int], gears: tuple[int, ...], t: float = 100.0,
            elapsed: float = 0.0) -> Member:
    s = _stats(np.array(values * 20), np.linspace(t - 50, t, 20 * len(values)))
    assert s.history is not None
    return Member(node, elapsed, {"S": gears}, {"S": Compact.of(s.view(t), t)},
                  {"S": Compact.of(s.history.view(t), t)})


def test_the_key_separates_every_declared_field_and_the_dims_but_not_initial_gears() -> None:
    base = FleetKey("m", "vllm", "bf16", "H100", 1)
    ident = base.identity("p", DIMS)
    assert base.identity("p", {"S": Dim(gears=(4, 2048), max=2048)}) == ident
    others = [FleetKey("m2", "vllm", "bf16", "H100", 1), FleetKey("m", "sglang", "bf16", "H100"),
              FleetKey("m", "vllm", "fp8", "H100"), FleetKey("m", "vllm", "bf16", "A100"),
              FleetKey("m", "vllm", "bf16", "H100", 2)]
    assert ident not in {k.identity("p", DIMS) for k in others}
    assert base.identity("q", DIMS) != ident
    assert base.identity("p", {"S": Dim(max=4096)}) != ident
    assert base.identity("p", {"S": Dim(max=2048, align=8)}) != ident
    with pytest.raises(ShapeError, match="tp_size"):
        FleetKey(tp_size=0)


def test_compact_keeps_ages_and_decays_by_the_time_since_the_publish() -> None:
    s = _stats(np.array([10, 20, 20]), np.array([90.0, 95.0, 100.0]))
    hist = s.view(100.0)
    c = Compact.of(hist, 100.0)
    assert c.ages.tolist() == [10.0, 0.0]
    later = c.at(CONFIG.half_life_seconds, 5000.0, CONFIG.half_life_seconds,
                 CONFIG.window_seconds)  # one half-life later, on another clock
    assert np.allclose(later.weights, hist.weights / 2)
    assert later.last_seen.tolist() == [5000.0 - 300 - 10, 5000.0 - 300]
    assert later.counts.tolist() == hist.counts.tolist()
    gone = c.at(CONFIG.window_seconds + 1, 0.0, CONFIG.half_life_seconds, CONFIG.window_seconds)
    assert gone.values.size == 0  # every value last seen over a window ago


@pytest.mark.parametrize("bad", [
    dict(values=np.array([2, 1])), dict(weights=np.array([np.nan, 1.0])),
    dict(counts=np.array([0, 1])), dict(ages=np.array([-1.0, 0.0])), dict(span=-1.0)])
def test_compact_refuses_what_a_histogram_cannot_hold(bad: dict) -> None:
    fields = dict(values=np.array([1, 2]), weights=np.ones(2), counts=np.ones(2, np.int64),
                  ages=np.zeros(2), span=1.0)
    with pytest.raises(ShapeError):
        Compact(**{**fields, **bad})


def test_merge_adds_weights_and_counts_value_by_value() -> None:
    a = _stats(np.array([10, 20]), np.array([1.0, 2.0])).view(2.0)
    b = _stats(np.array([20, 30]), np.array([1.0, 2.0])).view(2.0)
    m = merged([a, b])
    assert m.values.tolist() == [10, 20, 30] and m.counts.tolist() == [1, 2, 1]
    assert math.isclose(m.total_weight, a.total_weight + b.total_weight)
    part = scaled(m, 0.4)
    assert part.values.tolist() == [20] and part.counts.tolist() == [1]  # 0.4 event: dropped


def test_the_prior_is_one_members_worth_and_fades_with_the_half_life_then_the_window() -> None:
    members = [_member("a", [100, 200], (128, 256)), _member("b", [100, 200], (128, 256))]
    prior = prior_of(members, 100.0, CONFIG)
    assert prior is not None and prior.members == 2
    one = members[0].window["S"].at(0, 100.0, CONFIG.half_life_seconds, CONFIG.window_seconds)
    assert math.isclose(prior.window["S"].total_weight, one.total_weight)
    at_join = primed(prior, 100.0, 100.0, CONFIG, DIMS)["S"][0]
    half = primed(prior, 100.0, 100.0 + CONFIG.half_life_seconds, CONFIG, DIMS)["S"][0]
    assert math.isclose(half.total_weight, at_join.total_weight / 4, rel_tol=1e-9)  # own decay
    assert prior_weight(CONFIG.half_life_seconds, CONFIG.half_life_seconds, 600) == 0.5
    assert primed(prior, 100.0, 100.0 + CONFIG.plan_history_seconds, CONFIG, DIMS) == {}
    assert prior_of([], 0.0, CONFIG) is None


def test_a_late_node_with_the_prior_decides_the_fleets_gears_at_its_first_round() -> None:
    members = [_member(n, [100, 300, 1000], (128, 512, 1024)) for n in "abc"]
    prior = prior_of(members, 100.0, CONFIG)
    assert prior is not None
    late = DeviceLedger(profiles={"p": ProfileLedger.new(DIMS, 100.0, CONFIG)})
    cold = decide_round(late, 101.0, None, CONFIG)
    warm = decide_round(late, 101.0, None, CONFIG,
                        prior={"p": primed(prior, 100.0, 101.0, CONFIG, DIMS)})
    assert cold is not None and not cold.changed  # no evidence: the ladder stays
    assert warm is not None and warm.changed
    gears = set(warm.gears["p"]["S"].gears)
    assert {100, 300} <= gears and max(gears) >= 1000  # the fleet's values, on gears


def test_start_up_gears_are_the_members_set_that_pads_the_fleets_traffic_least() -> None:
    members = [_member("a", [100, 500], (128, 512, 2048)), _member("b", [100, 500], (100, 2048)),
               _member("c", [100, 500], (100, 500, 2048))]
    assert fleet_gears(members, DIMS) == {"S": (100, 500, 2048)}
    assert fleet_gears(members[:2], DIMS) == {"S": (128, 512, 2048)}
    assert fleet_gears(members, DIMS, most=2) == {"S": (100, 2048)}  # a set too long: left out
    assert fleet_gears(members, {"S": Dim(max=1024)}) is None  # every set past the bounds
    assert fleet_gears([], DIMS) is None
    assert fleet_gears(members, {"T": Dim()}) is None
    assert disagreement([(1, 2), (1, 2)]) == 0.0
    assert disagreement([(1, 2), (3,)]) == 1.0
    assert disagreement([(1, 2), (1, 3)]) == pytest.approx(2 / 3)


def test_costs_keep_the_busiest_members_measurements_last() -> None:
    m1, m2 = Measurement(8, 1.0, 10, 0.1), Measurement(8, 2.0, 20, 0.2)
    light = Member("a", 0, {}, {}, {}, {"S": [m1]})
    busy = _member("b", [100], (128,))
    busy = Member(busy.node, 0, busy.gears, busy.window, busy.history, {"S": [m2]})
    assert fleet_costs([busy, light]) == {"S": [m1, m2]}


def test_the_prior_keeps_to_the_dims_bounds() -> None:
    members = [_member("a", [100, 5000], (128, 8192))]
    prior = prior_of(members, 100.0, CONFIG)
    assert prior is not None
    views = primed(prior, 100.0, 100.0, CONFIG, {"S": Dim(max=2048), "T": Dim()})
    assert set(views) == {"S"} and views["S"][0].values.tolist() == [100]


def test_one_member_out_of_line_weighs_no_more_than_the_others() -> None:
    honest = [_member("a", [100], (128,)), _member("b", [100], (128,))]
    liar = _member("c", [1000], (1024,))
    c = liar.window["S"]
    liar = Member("c", 0.0, liar.gears, {"S": Compact(c.values, c.weights * 1e9, c.counts * 1000,
                                                       c.ages, c.span)}, liar.history)
    prior = prior_of([*honest, liar], 100.0, CONFIG)
    assert prior is not None
    w = prior.window["S"]
    share = w.weights[w.values == 1000].sum() / w.total_weight
    assert share <= 1 / 3 + 1e-9 and w.values.tolist()[0] == 100  # at most its share


def test_a_node_publishes_its_heaviest_values_only() -> None:
    s = _stats(np.array([5, 6, 7, 7, 8, 8, 8]), np.full(7, 100.0))
    c = Compact.of(s.view(100.0), 100.0, most=2)
    assert c.values.tolist() == [7, 8] and c.counts.tolist() == [2, 3]
