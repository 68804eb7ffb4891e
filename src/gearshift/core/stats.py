"""Decayed per-raw-value histograms of one (profile, dim), in time slices.

An event at `t` folds into slice `k = floor(t / slice_seconds)` as `exp(λ·(t − k·slice))`;
a read at `now` scales slice k by `exp(−λ·(now − k·slice))`, so every event weighs exactly
`exp(−λ·(now − t))`, λ = ln 2 / half-life. A slice counts while it may hold an event inside
the window, `(k + 1)·slice > now − window`: the hard window is exact to one slice (events at
most `slice_seconds` older than the window may still count, none inside it is lost).

Storage is a ring of `ceil(window / slice) + 1` slice rows over the distinct values seen in the
ring's slices (columns, grown by doubling), never the events; a row holds only the columns its
slice saw (sparse: sorted column indices, weights, counts), so memory is one entry per (slice,
value) seen, plus one column per value. Columns no slice uses any more are dropped when a row is
recycled, once they are a quarter of the columns. A row's arrays are never written in place
(replaced on change), so `frozen()` and `snapshot()` are consistent copies at the cost of a few
references.
Pure: no clock; times are whatever clock the caller uses for `now`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from gearshift.core.config import PolicyConfig
from gearshift.errors import ShapeError, StateError

_NO_SLICE = np.iinfo(np.int64).min
_STATE_KEYS = ("window_seconds", "half_life_seconds", "slice_seconds")


class _Row(NamedTuple):
    """One slice's entries: strictly increasing column indices, their Σ exp(λ·(t − k·slice))
    and counts (> 0), the integers in the narrowest unsigned type that holds them (`_narrow`:
    ~12 B an entry where a dense cell took 16). Never written in place."""

    cols: np.ndarray  # unsigned
    acc: np.ndarray  # float64
    cnt: np.ndarray  # unsigned


_EMPTY_ROW = _Row(np.empty(0, np.uint8), np.empty(0), np.empty(0, np.uint8))


def _narrow(a: np.ndarray, high: int | None = None) -> np.ndarray:
    """`a` (non-negative int64, at most `high`: default its maximum) as the narrowest unsigned
    integers that hold them (int64 past 32 bits: it adds to int64 without a float)."""
    top = (int(a.max()) if len(a) else 0) if high is None else high
    return a.astype(next(t for t in (np.uint8, np.uint16, np.uint32, np.int64)
                         if top <= np.iinfo(t).max), copy=False)


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

    Memory is bounded by the (slice, value) pairs seen, never by the number of events. A
    `history` (another DimStats, over a longer horizon: `PolicyConfig.history`) receives every
    event folded here: one entry per slice and value of a batch, at the mean time of that
    slice's events (each event weighs there within one slice of decay of its exact weight), at
    the cost of one entry per distinct value, not per event; events a full ring behind go as
    they are.
    """

    def __init__(self, config: PolicyConfig, history: DimStats | None = None) -> None:
        self.history = history
        self._params = {k: float(getattr(config, k)) for k in _STATE_KEYS}
        self._slice = config.slice_seconds
        self._window = config.window_seconds
        self._lam = math.log(2) / config.half_life_seconds
        self._keys = np.full(math.ceil(self._window / self._slice) + 1, _NO_SLICE, np.int64)
        self._rows = [_EMPTY_ROW] * len(self._keys)
        # Columns 0..n-1 in the order values first came; spare capacity beyond n is unused.
        self._n = 0
        self._values = np.empty(0, np.int64)
        self._last = np.empty(0)  # latest event time per column
        self._reindex()

    @property
    def entries(self) -> int:
        """The (slice, value) entries held: what memory and the saved state grow with."""
        return sum(len(r.cols) for r in self._rows)

    @property
    def nbytes(self) -> int:
        """Bytes of the arrays held: the rows' entries and the columns' capacity."""
        return (sum(a.nbytes for r in self._rows for a in r) + self._values.nbytes
                + self._last.nbytes)

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
            got = (np.bincount(c, minlength=n) if nm is None
                   else np.bincount(c, weights=nm, minlength=n).astype(np.int64))
            if self.history is not None:
                seen = np.flatnonzero(got)
                when = float(np.average(ts, weights=nm))
                self.history.fold(np.full(seen.size, when), self._values[seen], got[seen])
            self._add(row, np.bincount(c, weights=w, minlength=n), got)
        last = self._last.copy()  # never in place: frozen() holds the old one
        np.maximum.at(last, col, t)
        self._last = last

    def _add(self, row: int, acc: np.ndarray, cnt: np.ndarray) -> None:
        """Add dense per-column sums (length n, added to in place) to a row, which keeps its
        non-zero counts."""
        old = self._rows[row]
        if len(old.cols):
            acc[old.cols] += old.acc  # the sum the dense cell made: one addition per batch
            cnt[old.cols] += old.cnt
        cols = np.flatnonzero(cnt)
        self._rows[row] = _Row(_narrow(cols, self._n), acc[cols], _narrow(cnt[cols]))

    def view(self, now: float) -> Histogram:
        """The histogram at `now`: slices older than the window left out, decayed exactly."""
        live = (self._keys.astype(np.float64) + 1) * self._slice > now - self._window
        live &= self._keys != _NO_SLICE
        rows = np.flatnonzero(live)
        scale = np.exp(-self._lam * (now - self._keys[rows] * self._slice))
        n = self._n
        acc = np.zeros((len(rows), n))  # dense for the product: the same sums as ever
        counts = np.zeros(n, np.int64)
        for i, r in enumerate(rows.tolist()):
            cols, a, c = self._rows[r]
            acc[i, cols] = a
            counts[cols] += c
        weights = scale @ acc
        cols = self._order[counts[self._order] > 0]  # seen in the window, by value
        held = self._keys[rows][[len(self._rows[r].cols) > 0 for r in rows.tolist()]]
        since = float(held.min()) * self._slice if held.size else -math.inf
        return Histogram(self._values[cols], weights[cols], counts[cols], self._last[cols], since)

    def _claim(self, k: int) -> int:
        """The row of slice k; recycling a row drops its old slice, and the columns no row uses
        once they are a quarter of them (an unused column reads as count 0 until then)."""
        row = k % len(self._keys)
        if self._keys[row] != k:
            keys = self._keys.copy()  # never in place: frozen() holds the old one
            keys[row] = k
            self._keys = keys
            self._rows[row] = _EMPTY_ROW
            used = np.zeros(self._n, bool)
            for r in self._rows:
                used[r.cols] = True
            used = np.flatnonzero(used)
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
            self._values[n:n + len(new)] = new  # beyond n: frozen() holds only [:n]
            self._n = n + len(new)
            self._reindex()
            pos = np.searchsorted(self._sorted, v)
        return self._order[pos]

    def _resize(self, keep: np.ndarray, capacity: int) -> None:
        """Keep columns `keep` (increasing) as the first ones, within `capacity` columns."""
        values = np.zeros(capacity, np.int64)
        last = np.full(capacity, -np.inf)
        m = len(keep)
        values[:m], last[:m] = self._values[keep], self._last[keep]
        if m < self._n:  # renumber the rows' columns (in order: each row stays sorted)
            new = np.zeros(self._n, np.int64)
            new[keep] = np.arange(m)
            new = _narrow(new, m)
            self._rows = [r if not len(r.cols) else r._replace(cols=new[r.cols])
                          for r in self._rows]
        self._values, self._last, self._n = values, last, m
        self._reindex()

    def _reindex(self) -> None:
        self._order = np.argsort(self._values[:self._n])  # columns by value
        self._sorted = self._values[self._order]

    def snapshot(self) -> DimStats:
        """A DimStats reading as this one does now, unaffected by later folds here (references
        only, its history's snapshot with it), for a reader in another thread. Read it only
        (`view`): never fold into it."""
        copy = object.__new__(DimStats)
        copy.__dict__.update(self.__dict__)
        copy._rows = list(self._rows)  # the one container written in place
        copy.history = None if self.history is None else self.history.snapshot()
        return copy

    def frozen(self) -> FrozenStats:
        """The statistics as they are now, unaffected by later folds (references only)."""
        n = self._n
        return FrozenStats(self._params, self._keys, self._values[:n], self._last[:n],
                           tuple(self._rows))

    def to_state(self) -> dict[str, Any]:
        """A msgpack-able dict of the whole histogram (`FrozenStats.to_state`)."""
        return self.frozen().to_state()

    @classmethod
    def from_state(cls, state: dict[str, Any], config: PolicyConfig,
                   history: DimStats | None = None) -> DimStats:
        """Restore `to_state()` (its `history` is restored on its own), or the dense arrays of
        an older gearshift; StateError when malformed or saved under other time settings."""
        stats = cls(config, history)
        try:
            for key in _STATE_KEYS:
                if float(state[key]) != stats._params[key]:
                    raise StateError(f"stats saved with {key}={state[key]}, config has "
                                     f"{stats._params[key]}")
            keys = np.frombuffer(state["keys"], "<i8").astype(np.int64)
            values = np.frombuffer(state["values"], "<i8").astype(np.int64)
            last = np.frombuffer(state["last"], "<f8").astype(np.float64)
            rows = (_sparse_rows(state, len(keys), len(values)) if "sizes" in state
                    else _dense_rows(state, len(keys), len(values)))
        except (KeyError, TypeError, ValueError) as e:
            raise StateError(f"malformed stats state: {e}") from None
        if len(keys) != len(stats._keys) or len(last) != len(values):
            raise StateError("malformed stats state: array sizes disagree")
        if len(np.unique(values)) != len(values):
            raise StateError("malformed stats state: a value has two columns")
        stats._keys, stats._values, stats._last, stats._rows = keys, values, last, rows
        stats._n = len(values)
        stats._reindex()
        return stats


@dataclass(frozen=True)
class FrozenStats:
    """A DimStats at one moment (`DimStats.frozen`), to be encoded later, e.g. in another
    thread: nothing here is written again."""

    params: dict[str, float]
    keys: np.ndarray
    values: np.ndarray
    last: np.ndarray
    rows: tuple[_Row, ...]

    def emptied(self) -> FrozenStats:
        """The same settings, no events (restores as an empty DimStats)."""
        return FrozenStats(self.params, np.full(len(self.keys), _NO_SLICE, np.int64),
                           np.empty(0, np.int64), np.empty(0), (_EMPTY_ROW,) * len(self.keys))

    def to_state(self) -> dict[str, Any]:
        """A msgpack-able dict: the columns' values and last times, and per row its number of
        entries (`sizes`), then the entries of all rows in row order: column indices and
        counts as the narrowest little-endian unsigned integers that hold them (`cols_width`,
        `cnt_width`: 1, 2, 4 or 8 bytes), weights as float64."""
        cols = np.concatenate([r.cols for r in self.rows])
        cnt = np.concatenate([r.cnt for r in self.rows])
        return {**self.params, "keys": self.keys.astype("<i8").tobytes(),
                "values": self.values.astype("<i8").tobytes(),
                "last": self.last.astype("<f8").tobytes(),
                "sizes": np.array([len(r.cols) for r in self.rows], "<u4").tobytes(),
                "cols_width": _width(cols), "cols": cols.astype(f"<u{_width(cols)}").tobytes(),
                "acc": np.concatenate([r.acc for r in self.rows]).astype("<f8").tobytes(),
                "cnt_width": _width(cnt), "cnt": cnt.astype(f"<u{_width(cnt)}").tobytes()}


def _width(a: np.ndarray) -> int:
    """Bytes of the narrowest unsigned integer holding the (non-negative) entries of `a`."""
    high = int(a.max()) if len(a) else 0
    return next(w for w in (1, 2, 4, 8) if high < 1 << (8 * w))


def _sparse_rows(state: dict[str, Any], nrows: int, ncols: int) -> list[_Row]:
    """The rows of `FrozenStats.to_state`; ValueError unless each row's columns are increasing
    and within `ncols`, and its counts positive."""
    widths = (state["cols_width"], state["cnt_width"])
    if any(w not in (1, 2, 4, 8) or isinstance(w, bool) for w in widths):
        raise ValueError(f"integer widths {widths} are not 1, 2, 4 or 8")
    sizes = np.frombuffer(state["sizes"], "<u4").astype(np.int64)
    cols = np.frombuffer(state["cols"], f"<u{widths[0]}").astype(np.int64)
    acc = np.frombuffer(state["acc"], "<f8").astype(np.float64)
    cnt = np.frombuffer(state["cnt"], f"<u{widths[1]}").astype(np.int64)  # u8 past 2^63: < 0
    if len(sizes) != nrows or not int(sizes.sum()) == len(cols) == len(acc) == len(cnt):
        raise ValueError("entry counts disagree")
    rows = []
    for start, end in zip(np.cumsum(sizes) - sizes, np.cumsum(sizes), strict=True):
        c = cols[start:end]
        if len(c) and (int(c[-1]) >= ncols or (np.diff(c) <= 0).any()
                       or (cnt[start:end] <= 0).any()):
            raise ValueError("a row's columns are not increasing within the columns, or a "
                             "count is not positive")
        rows.append(_Row(_narrow(c, ncols), acc[start:end], _narrow(cnt[start:end])) if len(c)
                    else _EMPTY_ROW)
    return rows


def _dense_rows(state: dict[str, Any], nrows: int, ncols: int) -> list[_Row]:
    """The rows of an older gearshift's dense `acc` and `cnt` (rows × columns)."""
    acc = np.frombuffer(state["acc"], "<f8").astype(np.float64).reshape(nrows, ncols)
    cnt = np.frombuffer(state["cnt"], "<i8").astype(np.int64).reshape(nrows, ncols)
    rows = []
    for a, c in zip(acc, cnt, strict=True):
        cols = np.flatnonzero(c > 0)
        rows.append(_Row(_narrow(cols, ncols), a[cols], _narrow(c[cols])) if len(cols)
                    else _EMPTY_ROW)
    return rows
