"""The payback rule of priced plan mode: what a saving is worth in device seconds, against
what a gear costs to capture and to hold (docs/policy.md, "Priced decisions").

Pure: prices and a histogram in, figures out; no clock, I/O or torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from gearshift.core.config import PolicyConfig
from gearshift.core.costs import Prices
from gearshift.core.stats import Histogram


def strict(cost: Callable[[np.ndarray], np.ndarray], top: int) -> Callable[[np.ndarray],
                                                                          np.ndarray]:
    """`cost` made strictly increasing by a slope of a billionth of its value at `top` per
    unit (a flat measured curve would otherwise let a forced gear out of a plan)."""
    eps = 1e-9 * max(float(cost(np.array([max(top, 1)]))[0]), 1e-12) / max(top, 1)
    return lambda x: cost(x) + eps * np.asarray(x, dtype=float)


class Payback:
    """The payback rule of priced plan mode: a saving of x (in the plan's work, seconds per
    decayed event) is worth `seconds(x)` device seconds over `plan_payback_seconds`, at the
    rate the window's traffic ran: its decayed raw seconds R_w over the decayed length of the
    span it was gathered over, (1 - exp(-λ·span)) / λ. A gear is added only if that exceeds
    its capture on every worker (`Prices.capture_cost`), and its bytes fit the headroom."""

    def __init__(self, prices: Prices, seen: Histogram, cost: Callable[[np.ndarray],
                 np.ndarray], raw: float, now: float, config: PolicyConfig) -> None:
        lam = math.log(2) / config.half_life_seconds
        span = min(max(now - seen.since, config.slice_seconds),
                   config.window_seconds + config.slice_seconds)
        rate = float((seen.weights * cost(seen.values)).sum()) * lam / -math.expm1(-lam * span)
        self.prices, self.headroom = prices, prices.headroom
        self.per = rate * config.plan_payback_seconds / raw  # device seconds per unit of work
        self.horizon = config.plan_payback_seconds

    def seconds(self, saving: np.ndarray | float) -> np.ndarray:
        return np.asarray(saving, dtype=float) * self.per

    def capture(self, gears: np.ndarray | list[int]) -> np.ndarray:
        """Each gear's capture on every worker, in device seconds."""
        return self.prices.capture(np.asarray(gears, float)) * self.prices.workers

    def fits(self, gear: int) -> bool:
        return self.headroom is None or self.prices.held_bytes([gear]) <= self.headroom

    def take(self, gear: int) -> None:
        if self.headroom is not None:
            self.headroom -= self.prices.held_bytes([gear])

    def give(self, gear: int) -> None:
        if self.headroom is not None:
            self.headroom += self.prices.held_bytes([gear])

    def why(self, saved: float, gear: int) -> str:
        return (f"saves {saved:.3g} s over {self.horizon:g} s for "
                f"{float(self.capture([gear])[0]):.3g} s of capture")


def net_worth(saving: np.ndarray, a: np.ndarray, least: float, pay: Payback | None,
         evicted: np.ndarray | None = None) -> np.ndarray:
    """What each move toward `a` is worth (the last axis runs over `a`): unpriced, its
    `saving` over `least` (positive: worth making); priced, the device seconds it saves over
    the horizon net of its capture, for a saving of at least `least` whose graph fits the
    headroom (less the graph `evicted` frees, for a swap; else -inf)."""
    if pay is None:
        return np.where(saving >= least, saving - least + 1e-300, -np.inf)
    net = pay.seconds(saving) - pay.capture(a)
    fits = np.array([pay.fits(int(x)) for x in a])
    if evicted is not None and pay.headroom is not None:
        freed = pay.prices.gear_bytes(evicted)
        need = pay.prices.gear_bytes(a)
        fits = need[None, :] <= pay.headroom + freed[:, None]
    return np.where((saving >= least) & fits, net, -np.inf)
