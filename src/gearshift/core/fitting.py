"""The plan's target under a bytes bound: the gear set of least padded work that fits.

Plan mode's DP (`optimal.optimal_sets`) finds the best set of each count, blind to bytes. Under
a graph memory bound the best count's set may not fit, and the best set that fits need not be
any count's best: where bytes grow with the gear, a few large gears cost the room of many small
ones. So the target becomes the set of at most k gears minimising padded work + μ x bytes (a
Lagrangian relaxation of the bound: a term of each gear alone keeps the DP's Monge form), with
the least μ whose set fits `room`. The sets of all μ are the vertices of a convex curve (padded
work against bytes); the search walks it by breakpoints: between a set that fits (first the
forced gears alone) and one that does not (first the count's best), the μ where both score
alike either yields a set between them, which replaces one of the two, or none, and the set
that fits is the answer. At most `STEPS` runs of the DP, only where the count's best set does
not fit. The gears `forced` into every plan carry no penalty (they are held whatever they
cost). `bounded_target` is what the planner asks: that set, or None where the gears held fit
and pad at most a slack more. Pure: arrays in, a gear set out.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gearshift.core.costs import Prices
from gearshift.core.dims import Gears
from gearshift.core.moves import Work, padded
from gearshift.core.optimal import optimal_sets

STEPS = 4  # runs of the DP at most: each one a breakpoint of the curve
HELD_SLACK = 3.0  # the set that fits is aimed at only where the gears held pad more than it
# by this many `plan_move_gain`s of the work: nearer, trades follow the count's plan as before

Fn = Callable[[np.ndarray], np.ndarray]


def fitting_set(cand: np.ndarray, k: int, weight: np.ndarray, cost: Fn, held: Fn,
                room: float, forced: np.ndarray, best: Gears) -> Gears:
    """Of the sets of at most `k` of the candidates `cand` (ascending; each set ends at the
    last), the one of least padded work (`weight` per candidate, `cost` per gear) under
    μ x `held` bytes a gear (none on the `forced` gears), for the least μ whose set's bytes
    fit `room`, found within STEPS runs of the DP (else the best that fits of those seen);
    `best` is the set of μ = 0 (the count's best), returned where it fits. Where nothing
    fits, the forced gears and the last candidate."""
    free = ~np.isin(cand, forced)

    def scored(gears: Gears) -> float:  # the DP's padded work: its weights, forced ones too
        g = np.asarray(gears, np.int64)
        return float((weight * cost(g)[np.searchsorted(g, cand)]).sum())

    def size(gears: Gears) -> float:
        return float(held(np.asarray(gears, np.int64)).sum())

    def penalty(mu: float) -> Fn:
        return lambda x: mu * held(x) * free

    if size(best) <= room:
        return best
    fit = tuple(sorted({*forced.tolist(), int(cand[-1])}))  # the set of every large μ
    over = best
    for _ in range(STEPS):
        gap = size(over) - size(fit)
        if size(fit) > room or gap <= 0:
            break
        mu = (scored(fit) - scored(over)) / gap  # both score alike at mu
        mid = optimal_sets(cand, k, weight, cost=cost, penalty=penalty(mu)).gears(k)
        if mid in (fit, over) or scored(mid) + mu * size(mid) >= (
                scored(fit) + mu * size(fit)) * (1.0 - 1e-12):
            break  # no set between: `fit` is the least μ's that fits
        if size(mid) <= room:
            fit = mid
        else:
            over = mid
    return fit


def bounded_target(gears: list[int], size: int, target: Gears, work: Work, cand: np.ndarray,
                   weight: np.ndarray, forced: np.ndarray, prices: Prices, room: float,
                   slack: float) -> Gears | None:
    """The target of the plan's trades where the count's best set `target` (of `size` gears)
    does not fit the `room` a dim's graphs may hold: the `fitting_set` of the plan's DP inputs
    (`cand`, `weight`, `forced`); None where the `gears` held fit and pad at most `slack` more
    than it (trades then follow the count's plan)."""
    held = padded(np.array(gears, np.int64), work) - slack
    near = len(gears) <= size and prices.held_bytes(gears) <= room
    if near and held <= padded(np.array(target, np.int64), work):  # no set of `size` pads less
        return None
    fit = fitting_set(cand, size, weight, work.cost, prices.gear_bytes, room, forced, target)
    return None if near and held <= padded(np.array(fit, np.int64), work) else fit
