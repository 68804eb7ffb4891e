"""Plan mode's trades under the bytes bound (`best_trade`), on hand-built histograms: the
standard error a trade is scored with, the bytes it frees, what it may evict and what it pays.
(The trades as a decision round makes them: tests/core/test_payback.py.)"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from gearshift.core.config import PolicyConfig
from gearshift.core.costs import Line, Prices
from gearshift.core.moves import Work, padded
from gearshift.core.payback import Payback
from gearshift.core.stats import Histogram
from gearshift.core.trades import best_trade

CFG = PolicyConfig()
NOW = 1000.0
BYTES = Line(0.0, 1.0)  # a graph's bytes: its gear
GEARS = np.array([100, 200, 1000], np.int64)
NEW = np.array([500], np.int64)


def work(counts: dict[int, tuple[float, int]]) -> Work:
    """A histogram's Work: each value's decayed weight and number of events."""
    v = np.array(sorted(counts), np.int64)
    w = np.array([counts[x][0] for x in v])
    n = np.array([counts[x][1] for x in v])
    return Work(v, w, w * w / n)


def payback(w: Work, prices: Prices, config: PolicyConfig = CFG) -> Payback:
    hist = Histogram(w.values, w.w, np.ones(w.values.size, np.int64),
                     np.full(w.values.size, NOW), NOW - 250.0)
    return Payback(prices, hist, w.cost, float((w.w * w.values).sum()), NOW, config)


def trade(w: Work, least: float, headroom: float, kept: set[int] | None = None,
          fewest: int = 0, prices: Prices | None = None, gears: np.ndarray = GEARS,
          new: np.ndarray = NEW, config: PolicyConfig = CFG) -> list[tuple[str, int]]:
    prices = prices or Prices(Line(), bytes=BYTES, headroom=headroom)
    pay = payback(w, dataclasses.replace(prices, headroom=headroom), config)
    steps = best_trade(gears, new, w, float((w.w * w.values).sum()), "why", least, config,
                       pay, kept or {int(gears[-1])}, fewest)
    return [(a, g) for a, g, _ in steps]


# 500 saves 500 a unit of its weight 10; 200 (weight 1) is the gear that earns least per
# byte (800 for 200 bytes against 100's 10 x 100 for 100): 300 bytes free, 500 needs 500,
# so 500 comes in for 200. The exact saving: 500 x 10 - 300 x 1 (200's events pad to 500).
TRADED = [("evict", 200), ("add", 500)]
SAVING = 500 * 10.0 - 300 * 1.0


def test_the_exact_saving_is_the_padded_work_before_less_after() -> None:
    w = work({100: (10.0, 1000), 200: (1.0, 1000), 500: (10.0, 1000)})
    after = np.array([100, 500, 1000], np.int64)
    assert padded(GEARS, w) - padded(after, w) == SAVING
    assert trade(w, least=0.0, headroom=300.0) == TRADED


def test_the_standard_error_counts_the_evicted_gears_variance() -> None:
    # 500's saving is certain (1000 events); 200's loss rests on one event (800² x 1 of
    # variance): less one standard error of both, the trade saves less than `least`. On
    # 1000 events of 200 it is made. A trade scored on the addition's variance alone was
    # made on one sample.
    least = SAVING - 0.5 * math.sqrt(500**2 * 0.1 + 800**2 * 1.0)
    sure = work({100: (10.0, 1000), 200: (1.0, 1000), 500: (10.0, 1000)})
    assert trade(sure, least, headroom=300.0) == TRADED
    few = work({100: (10.0, 1000), 200: (1.0, 1), 500: (10.0, 1000)})
    assert trade(few, least, headroom=300.0) == []


def test_a_gear_that_fits_the_freed_room_exactly_evicts_no_more() -> None:
    # 300 bytes of room and 200's 200 freed: exactly 500's bytes, so 100 stays
    w = work({100: (10.0, 1000), 200: (1.0, 1000), 500: (10.0, 1000)})
    assert trade(w, least=0.0, headroom=300.0) == TRADED
    assert trade(w, least=0.0, headroom=299.0) == [("evict", 200), ("evict", 100),
                                                   ("add", 500)]


def test_at_the_plans_count_a_trade_evicts_at_least_one_gear_though_the_addition_fits() -> None:
    w = work({100: (10.0, 1000), 200: (1.0, 1000), 500: (10.0, 1000)})
    assert trade(w, least=0.0, headroom=1e6) == [("add", 500)]
    assert trade(w, least=0.0, headroom=1e6, fewest=1) == TRADED


def test_the_evicted_gear_is_the_one_that_earns_least_per_byte() -> None:
    # evicting 200 adds 2 x 800 of padding for 200 bytes (8 a byte), 100 adds 10 x 100 for
    # 100 (10 a byte): 200 goes, though it loses more in all; either frees enough
    w = work({100: (10.0, 1000), 200: (2.0, 1000), 500: (10.0, 1000)})
    assert trade(w, least=0.0, headroom=400.0) == [("evict", 200), ("add", 500)]


def test_a_kept_gear_is_never_evicted() -> None:
    w = work({100: (10.0, 1000), 200: (1.0, 1000), 500: (10.0, 1000)})
    assert trade(w, least=0.0, headroom=400.0, kept={200, 1000}) == [("evict", 100),
                                                                     ("add", 500)]
    # nothing left to evict that frees enough: no trade
    assert trade(w, least=0.0, headroom=300.0, kept={200, 1000}) == []


def test_of_the_trades_that_pay_the_one_that_saves_most_is_made() -> None:
    # 400 saves 600 x 5 and 500 saves 500 x 15 (its own events and 400's); either evicts 200
    w = work({100: (10.0, 1000), 200: (1.0, 1000), 400: (5.0, 1000), 500: (10.0, 1000)})
    assert trade(w, least=0.0, headroom=300.0, new=np.array([400, 500])) == TRADED
    assert trade(w, least=0.0, headroom=300.0, new=np.array([400])) == [("evict", 200),
                                                                        ("add", 400)]


def test_an_evicted_gear_without_traffic_costs_no_capture_again() -> None:
    # 200 serves nothing: the trade pays 500's capture alone (a price of three quarters of
    # what it saves), not 200's too
    w = work({100: (10.0, 1000), 500: (10.0, 1000)})
    free = payback(w, Prices(Line(), bytes=BYTES, headroom=300.0))
    score = 500 * 10.0 - math.sqrt(500**2 * 0.1)
    price = Line(0.75 * float(free.seconds(score)))
    steps = trade(w, 0.0, 300.0, prices=Prices(price, bytes=BYTES))
    assert steps == TRADED
    used = work({100: (10.0, 1000), 200: (1.0, 1000), 500: (10.0, 1000)})
    pay = payback(used, Prices(Line(), bytes=BYTES, headroom=300.0))
    reason = best_trade(GEARS, NEW, used, 1.0, "why", 0.0, CFG, pay, {1000})[-1][2]
    assert "to capture 200 again" in reason


def test_an_evicted_gear_with_traffic_is_paid_for_as_captured_again() -> None:
    # undoing the trade captures 200 again: at three quarters of the saving a capture, the
    # trade pays 500's and not both
    used = work({100: (10.0, 1000), 200: (1.0, 1000), 500: (10.0, 1000)})
    free = payback(used, Prices(Line(), bytes=BYTES, headroom=300.0))
    score = SAVING - math.sqrt(500**2 * 0.1 + 800**2 * 0.001)
    price = Line(0.75 * float(free.seconds(score)))
    assert trade(used, 0.0, 300.0, prices=Prices(price, bytes=BYTES)) == []
    assert trade(used, 0.0, 300.0, prices=Prices(Line(0.45 * float(free.seconds(score))),
                                                  bytes=BYTES)) == TRADED


def test_a_trade_moves_the_headroom_by_the_bytes_it_frees_and_takes() -> None:
    w = work({100: (10.0, 1000), 200: (1.0, 1000), 500: (10.0, 1000)})
    pay = payback(w, Prices(Line(), bytes=BYTES, headroom=350.0))
    best_trade(GEARS, NEW, w, 1.0, "why", 0.0, CFG, pay, {1000})
    assert pay.headroom == 350.0 + 200 - 500
