"""The fleet's pure part: which nodes may merge, what one publishes, and the prior it gives.

A fleet is every node (controller) publishing into one store (`controller/fleetstore.py`).
A *member* is one (node, device)'s entry of one profile. Two members merge only when their
`FleetKey.identity` is equal: the user's declaration (model, engine and its configuration, dtype,
device kind, tensor-parallel size) plus the profile's name and its dims' fields (not their
initial gears, which do not change the traffic). The device kind is in the key, so measured
costs, which hold only for one kind of device, are merged only across members of one kind.

A member publishes each dim's decayed statistics as a `Compact`: `core.stats.Histogram` at the
publish time, times kept as ages (seconds before the publish) so that they mean the same on any
node's clock. A reader ages them by the time since (`Compact.at`: weights times
exp(-ln 2 / half-life * elapsed), the decay every event of `DimStats` gets).

The prior (`prior_of`, `primed`): the other live members' statistics of a profile, aged to
now, each weighing at most the lower median of their total weights, summed and divided by
their number (one member's worth of traffic in the fleet's shape; one member out of line with
the others moves it by no more than its share),
then weighed as if this node had seen that traffic before it joined and none since: by
exp(-ln 2 / half-life * (now - joined)), and not at all once `now - joined` passes the
statistics' window (the window's and the plan history's, each with its own half-life and
window). Local traffic takes over as it accumulates: with steady traffic, the local weight
grows as 1 - exp(-λ a) while the prior's falls as exp(-λ a), so a round always reads about
one node's worth of evidence. A node whose traffic differs is held back no longer than a node
running all along is by a shift of its own traffic: the prior is gone after one window.

Start-up gears (`fleet_gears`): per dim, the one of the members' learned sets that pads the
fleet's traffic least. Pure: no clock, I/O, threads or torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields

import numpy as np

from gearshift.core.config import PolicyConfig
from gearshift.core.costs import Measurement
from gearshift.core.dims import MAX_VALUE, Dim, Gears, padded_cost
from gearshift.core.stats import Histogram
from gearshift.errors import ShapeError

MAX_KEY_TEXT = 1024  # characters of one declared field of the key
MAX_PUBLISHED = 4096  # values of one dim's statistics a node publishes: the heaviest
MAX_WEIGHT = float(1 << 53)  # of one value's weight and count: sums of many stay finite
Views = tuple[Histogram, Histogram]  # (window, history) added to a dim's own


@dataclass(frozen=True)
class FleetKey:
    """What the user declares of the nodes that may merge (`ControllerConfig.fleet_*`)."""

    model: str = ""
    engine: str = ""
    dtype: str = ""
    device_kind: str = ""
    tp_size: int = 1

    def __post_init__(self) -> None:
        for name in ("model", "engine", "dtype", "device_kind"):
            value = getattr(self, name)
            if not isinstance(value, str) or len(value) > MAX_KEY_TEXT:
                raise ShapeError(f"fleet key {name} must be text of at most {MAX_KEY_TEXT} "
                                 f"characters, got {str(value)[:60]!r}")
        if isinstance(self.tp_size, bool) or not isinstance(self.tp_size, int) or not (
                1 <= self.tp_size <= 1 << 16):
            raise ShapeError(f"fleet key tp_size must be an int in [1, 65536], "
                             f"got {self.tp_size!r}")

    def identity(self, profile: str, dims: Mapping[str, Dim]) -> str:
        """The text two members must share to merge: this key, the profile's name and each
        dim's fields but its initial gears."""
        parts = [repr([getattr(self, f.name) for f in fields(self)]), repr(profile)]
        for name in sorted(dims):
            d = dims[name]
            parts.append(repr((name, [(f.name, _plain(getattr(d, f.name))) for f in fields(d)
                                      if f.name != "gears"])))
        return "\n".join(parts)


def _plain(value: object) -> object:
    return [float(v) for v in value] if isinstance(value, (tuple, list)) else value


@dataclass(frozen=True)
class Compact:
    """One dim's decayed statistics as published: a Histogram at the publish time, its times
    as ages. `values` sorted, distinct, in [1, MAX_VALUE]; `weights` finite, >= 0; `counts` > 0;
    `ages` finite, >= 0 (the last event of each value, seconds before the publish); `span` >= 0
    (the oldest slice's start, seconds before the publish; inf: unknown)."""

    values: np.ndarray
    weights: np.ndarray
    counts: np.ndarray
    ages: np.ndarray
    span: float = math.inf

    def __post_init__(self) -> None:
        v, w, c, a = self.values, self.weights, self.counts, self.ages
        if not (v.ndim == w.ndim == c.ndim == a.ndim == 1 and len(v) == len(w) == len(c)
                == len(a)):
            raise ShapeError("compact statistics need four 1-D arrays of one length")
        if len(v) and (int(v[0]) < 1 or int(v[-1]) > MAX_VALUE or (np.diff(v) <= 0).any()):
            raise ShapeError("compact statistics' values are not distinct, increasing and "
                             "positive")
        if not (np.isfinite(w).all() and (w >= 0).all() and (w <= MAX_WEIGHT).all()
                and (c > 0).all() and (c <= MAX_WEIGHT).all()
                and np.isfinite(a).all() and (a >= 0).all()):
            raise ShapeError("compact statistics' weights, counts or ages are out of bounds")
        if not (self.span >= 0):  # NaN too
            raise ShapeError(f"compact statistics' span {self.span!r} is negative")

    @classmethod
    def of(cls, hist: Histogram, now: float, most: int = MAX_PUBLISHED) -> Compact:
        """`hist` (read at `now`) as published at `now`: its `most` heaviest values (a long
        tail of rare sizes is what a fleet's object would otherwise grow with)."""
        keep = (np.sort(np.argsort(hist.weights, kind="stable")[-most:])
                if len(hist.values) > most else slice(None))
        span = now - hist.since if math.isfinite(hist.since) else math.inf
        return cls(hist.values[keep].astype(np.int64), hist.weights[keep].astype(np.float64),
                   hist.counts[keep].astype(np.int64),
                   np.maximum(now - hist.last_seen[keep], 0.0), max(span, 0.0))

    def at(self, elapsed: float, now: float, half_life: float, window: float) -> Histogram:
        """The Histogram `elapsed` seconds after the publish, read at `now` (the reader's
        clock): weights decayed by `elapsed`, values last seen over `window` ago left out."""
        elapsed = max(elapsed, 0.0)
        last = now - elapsed - self.ages
        keep = last > now - window
        scale = math.exp(-math.log(2) / half_life * elapsed)
        since = now - elapsed - self.span if math.isfinite(self.span) else -math.inf
        return Histogram(self.values[keep], self.weights[keep] * scale, self.counts[keep],
                         last[keep], since)


def merged(hists: Iterable[Histogram]) -> Histogram:
    """Histograms added value by value: weights and counts summed, the latest `last_seen`,
    the earliest `since`."""
    hs = [h for h in hists if h.values.size]
    if len(hs) <= 1:
        return hs[0] if hs else Histogram.empty()
    v = np.unique(np.concatenate([h.values for h in hs]))
    w, c, last = np.zeros(v.size), np.zeros(v.size, np.int64), np.full(v.size, -np.inf)
    for h in hs:
        i = np.searchsorted(v, h.values)
        w[i] += h.weights
        c[i] += h.counts
        last[i] = np.maximum(last[i], h.last_seen)
    return Histogram(v, w, c, last, min(h.since for h in hs))


def scaled(hist: Histogram, factor: float) -> Histogram:
    """`hist` weighing `factor` times as much: counts rounded, values left with less than
    half an event left out."""
    counts = np.floor(hist.counts * factor + 0.5).astype(np.int64)
    keep = counts > 0
    return Histogram(hist.values[keep], hist.weights[keep] * factor, counts[keep],
                     hist.last_seen[keep], hist.since)


@dataclass(frozen=True)
class Member:
    """One (node, device)'s entry of one profile as read from the store, `elapsed` seconds
    after its publish: per dim its gears, statistics (the window's and the history's) and
    measured costs."""

    node: str
    elapsed: float
    gears: Mapping[str, Gears]
    window: Mapping[str, Compact]
    history: Mapping[str, Compact]
    costs: Mapping[str, Sequence[Measurement]] = field(default_factory=dict)

    def weight(self) -> float:
        return sum(float(c.weights.sum()) for c in self.window.values())


@dataclass(frozen=True)
class Prior:
    """The other live members of one profile, per dim averaged per member and aged to `now`:
    the window's and the history's Histograms, before the weighing by join time (`primed`)."""

    now: float
    members: int
    window: Mapping[str, Histogram]
    history: Mapping[str, Histogram]


def prior_of(members: Sequence[Member], now: float, config: PolicyConfig) -> Prior | None:
    """The prior of one profile from its other live `members` (None: there are none)."""
    if not members:
        return None
    hist = config.history()
    dims = {d for m in members for d in m.window}
    window = {d: _average([m.window[d].at(m.elapsed, now, config.half_life_seconds,
                                          config.window_seconds)
                           for m in members if d in m.window]) for d in dims}
    history = {d: _average([m.history[d].at(m.elapsed, now, hist.half_life_seconds,
                                            hist.window_seconds)
                            for m in members if d in m.history]) for d in dims}
    return Prior(now, len(members), window, history)


def _average(hists: list[Histogram]) -> Histogram:
    """The members' histograms summed and divided by their number, each weighing at most
    the lower median of their total weights: one member whose weights are out of line with
    the others' (a lie, or a burst) moves the prior by no more than its share."""
    if not hists:
        return Histogram.empty()
    totals = sorted(h.total_weight for h in hists)
    ref = totals[(len(totals) - 1) // 2]
    return scaled(merged(scaled(h, min(1.0, ref / h.total_weight))
                         if h.total_weight > ref > 0 else h for h in hists), 1.0 / len(hists))


def prior_weight(age: float, half_life: float, window: float) -> float:
    """What the prior weighs `age` seconds after the node joined: exp(-ln 2 * age /
    half-life), 0 from `window` on (the module docstring)."""
    if age >= window:
        return 0.0
    return math.exp(-math.log(2) / half_life * max(age, 0.0))


def primed(prior: Prior, joined: float, now: float, config: PolicyConfig,
           dims: Mapping[str, Dim]) -> dict[str, Views]:
    """Per dim of `dims`, the (window, history) Histograms to add to the node's own at `now`,
    for a profile the node has had since `joined` (values outside the dim's bounds left out);
    {} once the prior weighs nothing."""
    hist = config.history()
    fw = prior_weight(now - joined, config.half_life_seconds, config.window_seconds)
    fh = prior_weight(now - joined, hist.half_life_seconds, hist.window_seconds)
    if fw <= 0 and fh <= 0:
        return {}
    age = max(now - prior.now, 0.0)  # the prior was aged to its `now`: decay the rest
    dw = math.exp(-math.log(2) / config.half_life_seconds * age)
    dh = math.exp(-math.log(2) / hist.half_life_seconds * age)
    return {d: (scaled(_inside(prior.window.get(d), dim), fw * dw),
                scaled(_inside(prior.history.get(d), dim), fh * dh))
            for d, dim in dims.items() if d in prior.window or d in prior.history}


def _inside(hist: Histogram | None, dim: Dim) -> Histogram:
    """`hist`'s values within the dim's bounds (an empty Histogram for None)."""
    if hist is None:
        return Histogram.empty()
    keep = (hist.values >= dim.min) & (hist.values <= dim.max)
    return Histogram(hist.values[keep], hist.weights[keep], hist.counts[keep],
                     hist.last_seen[keep], hist.since)


def with_prior(own: Histogram, views: Views | None, which: int) -> Histogram:
    """A dim's own Histogram (its window's: `which` 0; its history's: 1) with the prior's
    (`views`, from `primed`; None: as it is)."""
    added = None if views is None else views[which]
    return own if added is None or not added.values.size else merged([own, added])


def fleet_gears(members: Sequence[Member], dims: Mapping[str, Dim],
                most: int = 1 << 10) -> dict[str, Gears] | None:
    """The start-up gears of a profile from its live `members` (None: none, or a dim no
    member has gears of within its bounds): per dim, of the members' sets of at most `most`
    gears within the dim's bounds, the one that pads the fleet's traffic (their windows'
    statistics added) least, in the dim's cost; the fewer gears on a tie."""
    if not members:
        return None
    out: dict[str, Gears] = {}
    for d, dim in dims.items():
        sets = sorted({tuple(m.gears[d]) for m in members if d in m.gears
                       and len(m.gears[d]) <= most and dim.min <= m.gears[d][0]
                       and m.gears[d][-1] <= dim.max}, key=len)
        if not sets:
            return None
        traffic = [m.window[d] for m in members if d in m.window]
        values = np.concatenate([c.values for c in traffic]) if traffic else np.empty(0, int)
        weights = np.concatenate([c.weights for c in traffic]) if traffic else np.empty(0)
        inside = (values >= dim.min) & (values <= dim.max)
        values, weights = values[inside], weights[inside]
        out[d] = min(sets, key=lambda g: float(weights @ padded_cost(dim, g, values))
                     if values.size else 0.0)
    return out


def disagreement(gear_sets: Sequence[Sequence[int]]) -> float:
    """How far members' gears of one dim disagree: the share of the gears any holds that not
    all hold (0: the same set; 1: nothing in common)."""
    sets = [set(s) for s in gear_sets]
    if len(sets) < 2:
        return 0.0
    union = set().union(*sets)
    return 1.0 - len(set.intersection(*sets)) / len(union) if union else 0.0


def fleet_costs(members: Sequence[Member]) -> dict[str, list[Measurement]]:
    """Every member's measurements per dim (one key, so one device kind), the lightest
    members' first: a cost book that keeps the latest per gear keeps the busiest's."""
    out: dict[str, list[Measurement]] = {}
    for m in sorted(members, key=Member.weight):
        for d, ms in m.costs.items():
            out.setdefault(d, []).extend(ms)
    return out
