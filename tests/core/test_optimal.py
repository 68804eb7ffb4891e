"""Hindsight-optimal gears: the Monge divide-and-conquer DP (and its dense layer, for few
values) against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gearshift.core import optimal
from gearshift.core.dims import Dim, padded_work
from gearshift.core.optimal import optimal_gears, optimal_sets

LINEAR = Dim()


def cost(
    gears: tuple[int, ...], values: np.ndarray, weights: np.ndarray, work: Dim = LINEAR
) -> float:
    return float((work.work(padded_work(gears, values, False)) * weights).sum())


def brute_force(
    values: np.ndarray, weights: np.ndarray, k: int, align: int, work: Dim = LINEAR
) -> float:
    candidates = np.unique(-(-values // align) * align)
    top, rest = int(candidates[-1]), [int(c) for c in candidates[:-1]]
    return min(
        cost((*combo, top), values, weights, work)
        for r in range(min(k, len(candidates)))
        for combo in itertools.combinations(rest, r)
    )


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(st.integers(1, 60), min_size=1, max_size=14),
    k=st.integers(1, 6),
    align=st.sampled_from([1, 1, 4]),
    data=st.data(),
)
def test_matches_brute_force(values: list[int], k: int, align: int, data: st.DataObject) -> None:
    v = np.array(values)
    weighted = data.draw(st.booleans())
    w = (
        np.array(data.draw(st.lists(st.floats(0.01, 10), min_size=v.size, max_size=v.size)))
        if weighted
        else np.ones(v.size)
    )
    gears = optimal_gears(v, k, w if weighted else None, align=align)
    assert len(gears) <= k and list(gears) == sorted(set(gears))
    assert all(g % align == 0 for g in gears) and gears[-1] >= v.max()
    assert cost(gears, v, w) == pytest.approx(brute_force(v, w, k, align), rel=1e-12, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.integers(1, 60), min_size=1, max_size=12),
    k=st.integers(1, 5),
    quadratic=st.floats(0.0, 2.0),
)
def test_a_cost_polynomial_is_minimised_exactly(values: list[int], k: int, quadratic: float):
    v, w = np.array(values), np.ones(len(values))
    work = Dim(cost=(3.0, 1.0, quadratic))
    plans = optimal_sets(v, k, cost=work.work)
    gears = plans.gears(k)
    assert gears[-1] == v.max()
    best = brute_force(v, w, k, 1, work)
    assert cost(gears, v, w, work) == pytest.approx(best, rel=1e-9)
    assert plans.costs[min(k, plans.costs.size) - 1] == pytest.approx(best, rel=1e-9)


def test_a_steeper_cost_puts_gears_higher() -> None:
    v = np.arange(1, 1001)
    linear = optimal_gears(v, 3)
    steep = optimal_sets(v, 3, cost=Dim(cost=(0.0, 1.0, 0.1)).work).gears(3)
    assert steep[-1] == linear[-1] == 1000 and steep[:2] > linear[:2]


def test_weights_move_the_gears() -> None:
    values = np.array([10, 20, 30])
    assert optimal_gears(values, 2, np.array([1.0, 100.0, 1.0])) == (20, 30)
    assert optimal_gears(values, 2, np.array([100.0, 1.0, 1.0])) == (10, 30)


def test_weights_equal_repeated_values() -> None:
    rng = np.random.default_rng(1)
    raw = rng.integers(1, 500, size=2000)
    distinct, counts = np.unique(raw, return_counts=True)
    assert optimal_gears(raw, 7) == optimal_gears(distinct, 7, counts.astype(float))


def test_few_values_get_one_gear_each() -> None:
    assert optimal_gears(np.array([5, 3, 5, 9]), 8) == (3, 5, 9)
    assert optimal_gears(np.array([5, 3, 9]), 8, align=4) == (4, 8, 12)


def test_largest_value_is_always_a_gear() -> None:
    values = np.r_[np.full(1000, 2), 1000]
    assert optimal_gears(values, 1) == (1000,)
    assert optimal_gears(values, 2) == (2, 1000)


def test_large_input_is_exact_against_the_quadratic_dp() -> None:
    rng = np.random.default_rng(2)
    values = rng.integers(1, 3000, size=400)
    w = rng.random(values.size)
    d, inv = np.unique(values, return_inverse=True)
    W = np.r_[0, np.cumsum(np.bincount(inv, w))]
    S = np.r_[0, np.cumsum(np.bincount(inv, w * values))]
    n = d.size
    run = np.array(
        [[d[j - 1] * (W[j] - W[i]) - (S[j] - S[i]) for j in range(n + 1)] for i in range(n + 1)]
    )
    f = run[0].copy()
    for _ in range(5):  # six gears
        f = np.array([0.0] + [min(f[i] + run[i, j] for i in range(j)) for j in range(1, n + 1)])
    gears = optimal_gears(values, 6, w)
    assert len(gears) == 6
    assert cost(gears, values, w) == pytest.approx(f[n] + (w * values).sum(), rel=1e-12)


@pytest.mark.parametrize(("k", "align"), [(0, 1), (2, 0)])
def test_bad_arguments(k: int, align: int) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        optimal_gears(np.array([1, 2]), k, align=align)


def test_empty_or_non_positive_values() -> None:
    with pytest.raises(ValueError, match="non-empty array of positive ints"):
        optimal_gears(np.array([], dtype=np.int64), 2)
    with pytest.raises(ValueError, match="non-empty array of positive ints"):
        optimal_gears(np.array([0, 3]), 2)


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(st.integers(1, 60), min_size=1, max_size=12),
    k=st.integers(1, 5),
    mu=st.floats(0.0, 5.0),
)
def test_a_per_gear_penalty_is_minimised_exactly(values: list[int], k: int, mu: float) -> None:
    # padded work + mu x gear for each gear held (a bytes term), against brute force; the
    # layers may stop early (the cost of exactly c gears is convex in c)
    v, w = np.array(values), np.ones(len(values))
    plans = optimal_sets(v, k, penalty=lambda x: mu * x.astype(float))
    candidates = np.unique(v)
    top, rest = int(candidates[-1]), [int(c) for c in candidates[:-1]]
    best = min(cost((*combo, top), v, w) + mu * (sum(combo) + top)
               for r in range(min(k, len(candidates))) for combo in itertools.combinations(rest, r))
    gears = plans.gears(k)
    assert gears[-1] == top and len(gears) <= k
    assert cost(gears, v, w) + mu * sum(gears) == pytest.approx(best, rel=1e-9, abs=1e-9)
    assert plans.costs[-1] == pytest.approx(best, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("n", [1, 2, 7, 64, 255, 300])
def test_the_dense_layer_gives_the_divide_and_conquers_values_and_argmins(n: int) -> None:
    # the DP's own inputs (prefix sums of weights and of weighted costs, a convex cost, a
    # per-gear penalty), layer after layer: the same floats, the same leftmost argmins
    rng = np.random.default_rng(n)
    gears = np.unique(rng.integers(1, 20 * n + 2, size=n))
    w = rng.random(gears.size) * 10
    work = 1e-3 + 7e-6 * gears + 5e-9 * gears.astype(float) ** 2
    g, p = np.r_[0.0, work], np.r_[0.0, 1e-4 * gears]
    W, S = np.r_[0.0, np.cumsum(w)], np.r_[0.0, np.cumsum(w * work)]
    prev = g * W - S + p
    prev[0] = 0.0
    for _ in range(6):
        cur, arg = optimal._layer(prev, g, W, S, p)
        dense, dense_arg = optimal._layer_dense(prev, g, W, S, p)
        assert np.array_equal(cur, dense) and np.array_equal(arg, dense_arg)
        prev = cur
