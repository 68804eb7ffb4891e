"""The plan's target under a bytes bound (`core.fitting`), and the trade that moves toward it."""

from __future__ import annotations

import itertools

import numpy as np

from gearshift.core.config import PolicyConfig
from gearshift.core.costs import Line, Prices
from gearshift.core.dims import Dim
from gearshift.core.fitting import bounded_target, fitting_set
from gearshift.core.gears import DimGears
from gearshift.core.moves import Work
from gearshift.core.optimal import optimal_sets
from gearshift.core.policy import decide
from gearshift.core.stats import DimStats

CAND = np.array([100, 200, 300, 400, 500, 700, 1000], np.int64)
WEIGHT = np.array([1.0, 2, 20, 5, 20, 10, 3])
NONE = np.array([], np.int64)


def linear(x: np.ndarray) -> np.ndarray:
    return x.astype(float)


def padded(gears: tuple[int, ...]) -> float:
    g = np.asarray(gears)
    return float((WEIGHT * g[np.searchsorted(g, CAND)]).sum())


def best_that_fits(room: float, k: int) -> float:
    rest = CAND[:-1].tolist()
    return min(padded((*c, 1000)) for r in range(k) for c in itertools.combinations(rest, r)
               if sum(c) + 1000 <= room)


def test_the_counts_best_set_is_kept_where_it_fits() -> None:
    best = optimal_sets(CAND, 5, WEIGHT).gears(5)
    assert fitting_set(CAND, 5, WEIGHT, linear, linear, 1e9, NONE, best) == best


def test_where_it_does_not_fit_the_set_is_the_best_that_fits() -> None:
    # bytes = the gear: the count's best 5 gears (300, 400, 500, 700, 1000: 2 900 bytes) are
    # over a room of 2 600; the best set that fits is found (brute force), of 4 gears
    best = optimal_sets(CAND, 5, WEIGHT).gears(5)
    assert sum(best) > 2600
    fit = fitting_set(CAND, 5, WEIGHT, linear, linear, 2600.0, NONE, best)
    assert sum(fit) <= 2600 and fit[-1] == 1000
    assert padded(fit) == best_that_fits(2600.0, 5)


def test_forced_gears_stay_and_nothing_fits_gives_them_alone() -> None:
    best = optimal_sets(CAND, 5, WEIGHT).gears(5)
    forced = np.array([200], np.int64)
    heavy = WEIGHT.copy()
    heavy[1] += 1e9  # as the planner forces a gear in
    fit = fitting_set(CAND, 5, heavy, linear, linear, 2000.0, forced, best)
    assert 200 in fit and sum(fit) <= 2000
    assert fitting_set(CAND, 5, heavy, linear, linear, 100.0, forced, best) == (200, 1000)


CFG = PolicyConfig(recent_use_protect_seconds=60.0, add_min_samples=2, min_window_events=1)


def test_over_the_bound_a_trade_moves_toward_the_best_set_that_fits() -> None:
    # Held 200, 500, 700 and 1000, 200 bytes free (a gear's bytes: its size). The count's plan
    # adds 300 and 400; neither fits. Evicting 700 earns least per byte (3 000 of padding for
    # 700 bytes), but 300 in for 700 does not save; the best set that fits (300, 500, 700,
    # 1000) has 300 in for 200: traded so, padding falls 30 100 -> 26 400. (Before this rule
    # the trade took the gear that earns least per byte, and nothing moved.)
    counts = {100: 1, 200: 2, 300: 20, 400: 5, 500: 20, 700: 10}
    stats = DimStats(CFG)
    values = [v for v, c in counts.items() for _ in range(c)]
    stats.fold(np.full(len(values), 750.0), np.array(values))
    held = (200, 500, 700, 1000)
    prices = Prices(Line(), bytes=Line(0.0, 1.0), headroom=200.0)
    d = decide({"B": Dim(gears=held, max=100_000)}, {"B": DimGears(held, dict.fromkeys(held, 0.0))},
               {"B": stats.view(1000.0)}, None, 1000.0, CFG, None, {"B": prices})
    assert [(c.action, c.gear) for c in d.changes] == [("evict", 200), ("add", 300)]
    assert "fit the memory bound" in d.changes[0].reason
    assert d.gears["B"].gears == (300, 500, 700, 1000)


def test_trades_follow_the_counts_plan_where_the_gears_held_are_within_the_slack() -> None:
    # bounded_target: the set that fits where the gears held pad more than it by over the
    # slack, else None (trades then follow the count's plan, as without this rule)
    work = Work(CAND, WEIGHT, WEIGHT, linear)
    best = optimal_sets(CAND, 5, WEIGHT).gears(5)
    prices = Prices(Line(), bytes=Line(0.0, 1.0))
    held = [200, 500, 700, 1000]
    fit = bounded_target(held, 5, best, work, CAND, WEIGHT, NONE, prices, 2600.0, 0.0)
    assert fit is not None and padded(fit) == best_that_fits(2600.0, 5) < padded(tuple(held))
    gap = padded(tuple(held)) - padded(fit)
    assert bounded_target(held, 5, best, work, CAND, WEIGHT, NONE, prices, 2600.0, gap) is None


def test_a_best_set_of_exactly_the_room_fits() -> None:
    best = optimal_sets(CAND, 5, WEIGHT).gears(5)
    room = float(sum(best))
    assert fitting_set(CAND, 5, WEIGHT, linear, linear, room, NONE, best) == best
    assert fitting_set(CAND, 5, WEIGHT, linear, linear, room - 1, NONE, best) != best


def test_more_gears_held_than_the_count_are_aimed_at_the_set_that_fits() -> None:
    # all seven candidates held fit the room and pad less than the count's best five, but
    # the plan holds five: the target is the set of five that fits, not "follow the plan"
    work = Work(CAND, WEIGHT, WEIGHT, linear)
    best = optimal_sets(CAND, 5, WEIGHT).gears(5)
    held = CAND.tolist()
    room = float(sum(held))
    prices = Prices(Line(), bytes=Line(0.0, 1.0))
    fit = bounded_target(held, 5, best, work, CAND, WEIGHT, NONE, prices, room, 0.0)
    assert fit == best
