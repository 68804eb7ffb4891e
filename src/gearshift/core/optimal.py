"""Hindsight-optimal static gears: the K gears minimising total (weighted) padded work.

Every value is served by the smallest gear >= it, and the largest gear covers the
largest value, so nothing splits or runs eager. That holds for splittable dims
too: with splitting allowed, padding alone is no objective (the single gear
`align` pads nothing: every value runs as unit chunks), so the optimum is taken
over covering sets, which is what a static set must offer when chunks cost.

An optimal gear is (the aligned value of) the largest value it serves, so the
problem is a partition of the sorted candidate gears into K runs. With prefix
sums W (weight) and S (weight x value), a run (i, j] served by gear g_j costs
g_j (W_j - W_i) - (S_j - S_i); this cost is Monge, so the argmin of each DP
layer is monotone and divide and conquer finds it in O(n log n) per layer,
vectorised by recursion level: O(K n log n) for n distinct values. Up to DENSE_MAX values a
layer is instead one pass over every (i, j) pair: O(n^2) work in a few numpy calls, where
the divide and conquer's calls per level cost more than the work (decode's batch sizes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from gearshift.core.dims import Gears

DENSE_MAX = 192  # values up to which a DP layer is one pass over every pair (`_layer_dense`)


@dataclass(frozen=True)
class OptimalSets:
    """The optimal gear set of every count up to `costs.size`, from one run of the DP.

    `costs[c - 1]` is the minimal sum(weight x gear) (or x cost(gear), with `optimal_sets`'s
    `cost`) over covering sets of at most c gears
    (non-increasing in c); `gears(c)` is such a set.
    """

    candidates: np.ndarray
    costs: np.ndarray
    back: np.ndarray

    def gears(self, count: int) -> Gears:
        chosen, j = [], self.candidates.size
        for layer in range(min(count, self.costs.size) - 1, -1, -1):
            chosen.append(int(self.candidates[j - 1]))
            j = int(self.back[layer, j])
            if j == 0:
                break
        return tuple(sorted(chosen))


def optimal_gears(
    values: np.ndarray, k: int, weights: np.ndarray | None = None, align: int = 1
) -> Gears:
    """The at most `k` gears (multiples of `align`) minimising sum(weight x gear).

    `values` are raw sizes (any order, repeats allowed); `weights` default to one
    per value (counts), else any non-negative floats such as decayed weights.
    """
    return optimal_sets(values, k, weights, align).gears(k)


def optimal_sets(
    values: np.ndarray,
    k: int,
    weights: np.ndarray | None = None,
    align: int = 1,
    cost: Callable[[np.ndarray], np.ndarray] | None = None,
    penalty: Callable[[np.ndarray], np.ndarray] | None = None,
) -> OptimalSets:
    """The optimal sets of 1..k gears at once (`optimal_gears` for every count up to k).
    With `cost` (increasing, as `Dim.work`), sum(weight x cost(gear)) is minimised instead;
    the runs' cost keeps the Monge form with cost(g_j) in place of g_j. With `penalty`, each
    gear held adds penalty(gear) to the objective (and to `costs`): a term of the run's
    own gear alone, so the form stays Monge."""
    values = np.asarray(values, dtype=np.int64)
    if k < 1 or align < 1:
        raise ValueError(f"k and align must be >= 1, got k={k}, align={align}")
    if values.size == 0 or values.min() < 1:
        raise ValueError("values must be a non-empty array of positive ints")
    weights = np.ones(values.size) if weights is None else np.asarray(weights, np.float64)
    gears, inverse = np.unique(-(-values // align) * align, return_inverse=True)
    k = min(k, gears.size)
    work = (lambda x: x.astype(np.float64)) if cost is None else cost
    w = np.bincount(inverse, weights=weights)
    s = np.bincount(inverse, weights=weights * work(values))
    W = np.r_[0.0, np.cumsum(w)]
    S = np.r_[0.0, np.cumsum(s)]
    g = np.r_[0.0, work(gears)]  # g[j]: cost of the gear of the run ending at candidate j
    p = np.r_[0.0, penalty(gears)] if penalty is not None else np.zeros(g.size)
    n = gears.size
    cost = g * W - S + p  # one run (0, j]
    cost[0] = 0.0
    costs = np.empty(k)
    costs[0] = cost[n] + S[n]
    back = np.zeros((k, n + 1), dtype=np.int64)
    solve = _layer_dense if n <= DENSE_MAX else _layer
    for layer in range(1, k):
        cost, back[layer] = solve(cost, g, W, S, p)
        costs[layer] = cost[n] + S[n]
        if penalty is not None and costs[layer] >= costs[layer - 1]:
            # the best cost of exactly c gears is convex in c (the runs' cost is Monge): once
            # one more gear saves nothing, no more gears will; the sets stop at this count
            return OptimalSets(gears, costs[:layer], back[:layer])
    return OptimalSets(gears, costs, back)


def _layer(
    prev: np.ndarray, g: np.ndarray, W: np.ndarray, S: np.ndarray, p: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """cur[j] = min over 0 <= i < j of prev[i] + cost(i, j) (+ p[j], the gear's penalty),
    with the leftmost argmin.

    prev[0] = 0 lets a layer use fewer runs. Rows are solved level by level of the
    divide-and-conquer recursion: each level is one vectorised pass over all its
    segments (rows lo..hi whose argmins lie in olo..ohi).
    """
    n = g.size - 1
    cur = np.zeros(n + 1)
    arg = np.zeros(n + 1, dtype=np.int64)
    lo, hi = np.array([1]), np.array([n])
    olo, ohi = np.array([0]), np.array([n - 1])
    while lo.size:
        mid = (lo + hi) // 2
        lens = np.minimum(ohi, mid - 1) - olo + 1
        starts = np.cumsum(lens) - lens
        seg = np.repeat(np.arange(mid.size), lens)
        i = np.arange(seg.size) - starts[seg] + olo[seg]
        j = mid[seg]
        val = prev[i] + g[j] * (W[j] - W[i]) - (S[j] - S[i]) + p[j]
        best = np.minimum.reduceat(val, starts)
        hits = np.flatnonzero(val == best[seg])
        at = i[hits[np.searchsorted(hits, starts)]]
        cur[mid], arg[mid] = best, at
        left, right = mid > lo, mid < hi
        lo, hi, olo, ohi = (
            np.concatenate((lo[left], mid[right] + 1)),
            np.concatenate((mid[left] - 1, hi[right])),
            np.concatenate((olo[left], at[right])),
            np.concatenate((at[left], ohi[right])),
        )
    return cur, arg


def _layer_dense(
    prev: np.ndarray, g: np.ndarray, W: np.ndarray, S: np.ndarray, p: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """`_layer` over every pair i < j at once (the same sums in the same order, so the same
    values), with the leftmost argmin of each column."""
    n = g.size - 1
    val = prev[:, None] + g[None, :] * (W[None, :] - W[:, None]) - (S[None, :] - S[:, None]) \
        + p[None, :]
    val[np.tri(n + 1, dtype=bool)] = np.inf  # i >= j: no run
    arg = val.argmin(axis=0)  # the first minimum: the leftmost
    cur = val[arg, np.arange(n + 1)]
    cur[0], arg[0] = 0.0, 0
    return cur, arg
