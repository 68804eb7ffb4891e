"""Decayed per-raw-value histograms of one (profile, dim), in time slices.

An event at `t` folds into slice `k = floor(t / slice_seconds)` as `exp(λ·(t − k·slice))`;
a read at `now` scales slice k by `exp(−λ·(now − k·slice))`, so every event weighs exactly
`exp(−λ·(now − t))`, λ = ln 2 / half-life. A slice counts while it may hold an event inside
the window, `(k + 1)·slice > now − window`: the hard window is exact to one slice (events at
most `slice_seconds` older than the window may still count, none inside it is lost).

Storage is a ring of `ceil(window / slice) + 1` slice rows × the distinct values seen in the
ring's slices (columns, grown by doubling), never the events; columns no slice uses any more
are dropped when a row is recycled, once they are a quarter of the columns.
Pure: no clock; times are whatever clock the caller uses for `now`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from gearshift.core.config import PolicyConfig
from gearshift.errors import ShapeError, StateError

_NO_SLICE = np.iinfo(np.int64).min
_STATE_KEYS = ("window_seconds", "half_life_seconds", "slice_seconds")


@dataclass(frozen=True)
class Histogram:
    """Decayed per-raw-value statistics of one (profile, dim) at a given `now`.

    `values` are sorted and distinct; `weights[i]` is the sum of `exp(−λ·(now − t_e))` over
    the events of `values[i]` inside the window, `counts[i]` their number (> 0), and
    `last_seen[i]` the latest of their times; `since` the start of the oldest slice holding
    any of them (-inf: unknown), so `now - since` bounds the span the weights were gathered
    over (a rate: `total_weight` against that span's decayed length).
    """

    values: np.ndarray
    weights: np.ndarray
    counts: np.ndarray
    last_seen: np.ndarray
    since: float = -math.inf

    @staticmethod
    def empty() -> Histogram:
        return Histogram(np.empty(0, np.int64), np.empty(0), np.empty(0, np.int64), np.empty(0))

    @property
    def total_weight(self) -> float:
        return float(self.weights.sum())

    @property
    def total_count(self) -> int:
        return int(self.counts.sum())


class DimStats:
    """Decayed histogram of one (profile, dim)'s raw values in time slices.

    Memory is bounded by slices × distinct values, never by the number of events. A `history`
    (another DimStats, over a longer horizon: `PolicyConfig.history`) receives every event
    folded here: one entry per slice and value of a batch, at the mean time of that slice's
    events (each event weighs there within one slice of decay of its exact weight), at the
    cost of one entry per distinct value, not per event; events a full ring behind go as
    they are.
    """

    def __init__(self, config: PolicyConfig, history: DimStats | None = None) -> None:
        self.history = history
        self._params = {k: float(getattr(config, k)) for k in _STATE_KEYS}
        self._slice = config.slice_seconds
        self._window = config.window_seconds
        self._lam = math.log(2) / config.half_life_seconds
        self._keys = np.full(math.ceil(self._window / self._slice) + 1, _NO_SLICE, np.int64)
        # Columns 0..n-1 in the order values first came; spare capacity beyond n is zero.
        self._n = 0
        self._values = np.empty(0, np.int64)
        self._acc = np.zeros((len(self._keys), 0))  # Σ exp(λ·(t − k·slice)) per (row, column)
        self._cnt = np.zeros((len(self._keys), 0), np.int64)
        self._last = np.empty(0)  # latest event time per column
        self._reindex()

    def fold(self, times: np.ndarray, values: np.ndarray,
             counts: np.ndarray | None = None) -> None:
        """Add one batch of events (float64 seconds, int64 raw sizes), in any order; entry i
        stands for `counts[i]` events (default: one each).

        Events older than the ring (a full window behind the newest slice) are left out here;
        the history still gets them.
        """
        t = np.asarray(times, np.float64)
        v = np.asarray(values, np.int64)
        many = None if counts is None else np.asarray(counts, np.int64)
        if t.ndim != 1 or t.shape != v.shape or (many is not None and many.shape != t.shape):
            raise ShapeError(f"fold needs 1-D arrays of one length, got {t.shape} {v.shape}"
                             + ("" if many is None else f" {many.shape}"))
        if not len(t):
            return
        k = np.floor(t / self._slice).astype(np.int64)
        lowest = max(int(k.max()), int(self._keys.max())) - len(self._keys) + 1
        if int(k.min()) < lowest:
            keep = k >= lowest
            if self.history is not None:  # it may still hold them
                self.history.fold(t[~keep], v[~keep], None if many is None else many[~keep])
            t, v, k = t[keep], v[keep], k[keep]
            many = None if many is None else many[keep]
            if not len(t):
                return
        slices = [(kk, k == kk) for kk in range(int(k.min()), int(k.max()) + 1)]
        rows = [(self._claim(kk), m) for kk, m in slices if m.any()]
        col = self._columns(v)  # after the claims: recycling a row may drop columns
        e = np.exp(self._lam * (t - k * self._slice))
        if many is not None:
            e *= many
        n = self._n
        for row, m in rows:
            one = len(rows) == 1
            c, w, ts = (col, e, t) if one else (col[m], e[m], t[m])
            nm = None if many is None else (many if one else many[m])
            self._acc[row, :n] += np.bincount(c, weights=w, minlength=n)
            got = (np.bincount(c, minlength=n) if nm is None
                   else np.bincount(c, weights=nm, minlength=n).astype(np.int64))
            self._cnt[row, :n] += got
            if self.history is not None:
                seen = np.flatnonzero(got)
                when = float(np.average(ts, weights=nm))
                self.history.fold(np.full(seen.size, when), self._values[seen], got[seen])
        np.maximum.at(self._last, col, t)

    def view(self, now: float) -> Histogram:
        """The histogram at `now`: slices older than the window left out, decayed exactly."""
        live = (self._keys.astype(np.float64) + 1) * self._slice > now - self._window
        live &= self._keys != _NO_SLICE
        scale = np.exp(-self._lam * (now - self._keys[live] * self._slice))
        n = self._n
        counts = self._cnt[live, :n].sum(axis=0)
        weights = scale @ self._acc[live, :n]
        cols = self._order[counts[self._order] > 0]  # seen in the window, by value
        held = self._keys[live][self._cnt[live, :n].any(axis=1)]
        since = float(held.min()) * self._slice if held.size else -math.inf
        return Histogram(self._values[cols], weights[cols], counts[cols], self._last[cols], since)

    def _claim(self, k: int) -> int:
        """The row of slice k; recycling a row drops its old slice, and the columns no row uses
        once they are a quarter of them (an unused column reads as count 0 until then)."""
        row = k % len(self._keys)
        if self._keys[row] != k:
            self._keys[row] = k
            self._acc[row] = 0.0
            self._cnt[row] = 0
            used = np.flatnonzero(self._cnt[:, :self._n].any(axis=0))
            if 4 * len(used) <= 3 * self._n:  # a quarter or more of the columns unused: compact
                cap = len(self._values)  # and halve or more when a quarter or less of it is used
                self._resize(used, 2 * len(used) if 4 * len(used) <= cap else cap)
        return row

    def _columns(self, v: np.ndarray) -> np.ndarray:
        """The column of each value, adding columns for values not seen yet."""
        pos = np.searchsorted(self._sorted, v)
        known = pos < self._n
        known[known] = self._sorted[pos[known]] == v[known]
        if not known.all():
            new = np.unique(v[~known])
            n = self._n
            if n + len(new) > len(self._values):
                self._resize(np.arange(n), max(2 * len(self._values), n + len(new)))
            self._values[n:n + len(new)] = new
            self._n = n + len(new)
            self._reindex()
            pos = np.searchsorted(self._sorted, v)
        return self._order[pos]

    def _resize(self, keep: np.ndarray, capacity: int) -> None:
        """Keep columns `keep` (in order) as the first ones, within `capacity` columns."""
        values = np.zeros(capacity, np.int64)
        acc = np.zeros((len(self._keys), capacity))
        cnt = np.zeros((len(self._keys), capacity), np.int64)
        last = np.full(capacity, -np.inf)
        m = len(keep)
        values[:m], acc[:, :m], cnt[:, :m], last[:m] = (
            self._values[keep], self._acc[:, keep], self._cnt[:, keep], self._last[keep])
        self._values, self._acc, self._cnt, self._last, self._n = values, acc, cnt, last, m
        self._reindex()

    def _reindex(self) -> None:
        self._order = np.argsort(self._values[:self._n])  # columns by value
        self._sorted = self._values[self._order]

    def to_state(self) -> dict[str, Any]:
        """A msgpack-able dict of the whole histogram (little-endian arrays as bytes)."""
        n = self._n
        return {**self._params, "keys": self._keys.astype("<i8").tobytes(),
                "values": self._values[:n].astype("<i8").tobytes(),
                "acc": self._acc[:, :n].astype("<f8").tobytes(),
                "cnt": self._cnt[:, :n].astype("<i8").tobytes(),
                "last": self._last[:n].astype("<f8").tobytes()}

    @classmethod
    def from_state(cls, state: dict[str, Any], config: PolicyConfig,
                   history: DimStats | None = None) -> DimStats:
        """Restore `to_state()` (its `history` is restored on its own); StateError when
        malformed or saved under other time settings."""
        stats = cls(config, history)
        try:
            for key in _STATE_KEYS:
                if float(state[key]) != stats._params[key]:
                    raise StateError(f"stats saved with {key}={state[key]}, config has "
                                     f"{stats._params[key]}")
            rows = len(stats._keys)
            keys = np.frombuffer(state["keys"], "<i8").astype(np.int64)
            values = np.frombuffer(state["values"], "<i8").astype(np.int64)
            shape = (rows, len(values))
            acc = np.frombuffer(state["acc"], "<f8").astype(np.float64).reshape(shape)
            cnt = np.frombuffer(state["cnt"], "<i8").astype(np.int64).reshape(shape)
            last = np.frombuffer(state["last"], "<f8").astype(np.float64)
        except (KeyError, TypeError, ValueError) as e:
            raise StateError(f"malformed stats state: {e}") from None
        if len(keys) != rows or len(last) != len(values):
            raise StateError("malformed stats state: array sizes disagree")
        stats._keys, stats._values, stats._acc, stats._cnt, stats._last = (
            keys, values, acc, cnt, last)
        stats._n = len(values)
        stats._reindex()
        return stats
