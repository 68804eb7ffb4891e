"""Padded work of gear sets over a decayed histogram, and what one move changes of it: the
prefix sums of the weights (`Work`), the saving of each addition, the loss of each eviction,
the saving of each swap (each with its variance or standard error), and a set's padded work.
Plan mode's steps are scored with these (`planner`). Pure: arrays in, arrays out.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gearshift.core.dims import Dim

LINEAR = Dim().work  # the default cost: a chunk's size


def padded(g: np.ndarray, work: Work) -> float:
    """The padded work of the values up to the largest of gears `g` (ascending)."""
    lo = np.r_[0, g[:-1]]
    return float((work.cost(g) * work.weight(lo, g)).sum())


def additions(g: np.ndarray, a: np.ndarray, work: Work) -> tuple[np.ndarray, np.ndarray]:
    """Padded work saved by adding each of `a` to `g` (none held, all below the largest),
    and its variance."""
    j = np.searchsorted(g, a)
    lo = np.where(j > 0, g[np.maximum(j - 1, 0)], 0)
    d = work.cost(g[j]) - work.cost(a)  # the values in (lo, a] drop from g[j] to a
    return d * work.weight(lo, a), d * d * work.var(lo, a)


def evictions(g: np.ndarray, e: np.ndarray, work: Work) -> tuple[np.ndarray, np.ndarray]:
    """Padded work added by evicting each gear `g[e]` (never the largest), and its variance."""
    assert (e < g.size - 1).all(), "the largest gear is never evicted"
    lo = np.where(e > 0, g[np.maximum(e - 1, 0)], 0)
    d = work.cost(g[e + 1]) - work.cost(g[e])  # the values in (lo, g] rise to the next gear
    return d * work.weight(lo, g[e]), d * d * work.var(lo, g[e])


def swaps(g: np.ndarray, e: np.ndarray, a: np.ndarray,
           work: Work) -> tuple[np.ndarray, np.ndarray]:
    """Padded work saved (E x A) by replacing gear g[e] (never the largest) with a, and its
    standard error."""
    add, add_var = additions(g, a, work)
    loss, loss_var = evictions(g, e, work)
    gain = add[None, :] - loss[:, None]
    var = add_var[None, :] + loss_var[:, None]
    x = g[e][:, None]
    lo = np.where(e > 0, g[np.maximum(e - 1, 0)], 0)[:, None]
    nxt = g[e + 1][:, None]
    below = (a > lo) & (a < x)  # a takes the lower part of x's run, the rest rises to nxt
    above = (a > x) & (a < nxt)  # x's run rises to a, a takes the lower part of nxt's run
    cx, ca, cn = work.cost(x), work.cost(a), work.cost(nxt)
    gain = np.where(below, (cx - ca) * work.weight(lo, a) - (cn - cx) * work.weight(a, x), gain)
    var = np.where(below, (cx - ca) ** 2 * work.var(lo, a) + (cn - cx) ** 2 * work.var(a, x), var)
    gain = np.where(above, (cn - ca) * work.weight(x, a) - (ca - cx) * work.weight(lo, x), gain)
    var = np.where(above, (cn - ca) ** 2 * work.var(x, a) + (ca - cx) ** 2 * work.var(lo, x), var)
    return gain, np.sqrt(var)


class Work:
    """Prefix sums of a histogram's decayed weights and of their variance proxy (w² / count:
    each event weighs w / count), for the weight of any value interval (lo, hi]; `cost` is the
    work of a chunk of each size (`Dim.work`)."""

    def __init__(self, values: np.ndarray, w: np.ndarray, q: np.ndarray,
                 cost: Callable[[np.ndarray], np.ndarray] = LINEAR) -> None:
        self.values, self.w, self.cost = values, w, cost
        self._w = np.r_[0.0, np.cumsum(w)]
        self._q = np.r_[0.0, np.cumsum(q)]

    def _at(self, prefix: np.ndarray, x: np.ndarray | int) -> np.ndarray:
        return prefix[np.searchsorted(self.values, x, "right")]

    def weight(self, lo: np.ndarray | int, hi: np.ndarray | int) -> np.ndarray:
        return self._at(self._w, hi) - self._at(self._w, lo)

    def var(self, lo: np.ndarray | int, hi: np.ndarray | int) -> np.ndarray:
        return self._at(self._q, hi) - self._at(self._q, lo)


def padding_words(saved: float, raw: float, sd: float | None = None) -> str:
    """A move's effect on padding in words, in points of the raw work: "down" for a saving,
    "up" for a loss (no signed figure to misread); a standard error `sd` is printed as ± only
    when it is narrower than the saving, else named as what it is."""
    pts, word = 100 * abs(float(saved)) / raw, "down" if saved >= 0 else "up"
    if sd is None:
        return f"padding {word} {pts:.2f} pts"
    err = 100 * float(sd) / raw
    if round(err, 2) < round(pts, 2):  # as printed
        return f"padding {word} {pts:.2f} ± {err:.2f} pts"
    return f"padding {word} {pts:.2f} pts (standard error {err:.2f} pts, as large)"
