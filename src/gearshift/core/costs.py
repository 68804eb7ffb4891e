"""What a gear costs on a device: replay seconds per chunk, capture seconds and graph bytes.

Workers measure every graph they capture (`Measurement`); `fit` turns one dim's measurements
into `DimCosts`: replay seconds and capture seconds per gear, each a `Curve` monotone in the
gear (isotonic over the per-gear medians, linear in between and beyond: a capture runs the
graph's work, convex in the gear where that work is, as on the cpu, nearly flat where launch
overheads dominate, so no straight line fits both), and graph bytes as a `Line`, A + B·gear
(least squares over the per-gear medians, A and B never negative). `Prices` is what plan mode
prices one dim's moves with (docs/policy.md, "Priced decisions"), with the bytes of its
profile's static input buffers where a worker reported them (`buffer_line`: counted once per
profile and worker, at its largest gears, `buffer_bytes`). Pure: data in, fits out; no clock,
I/O or torch. Every measured value is bounded on construction, so a broken worker's figures
are refused (`ShapeError`), never fitted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gearshift.core.dims import MAX_VALUE, Dim
from gearshift.errors import ShapeError

MAX_MEASURED_SECONDS = 3600.0  # one capture or replay: an hour is already a broken device
MAX_GRAPH_BYTES = 1 << 44  # 16 TiB: no device holds a larger graph
MIN_GEARS = 2  # distinct gears measured before a dim's replay curve replaces Dim.cost
MAX_POINTS = 256  # per-gear medians a fit keeps (the largest gears)


@dataclass(frozen=True)
class Measurement:
    """One graph, measured by the worker that captured it: `gear` on one dim, the seconds
    adding it took (warm-up, capture and the timed replays), the device memory it holds, and
    a replay's seconds (the median of a few, synchronised)."""

    gear: int
    capture_seconds: float
    graph_bytes: int
    replay_seconds: float

    def __post_init__(self) -> None:
        if isinstance(self.gear, bool) or not isinstance(self.gear, (int, np.integer)) or not (
                1 <= self.gear <= MAX_VALUE):
            raise ShapeError(f"measurement gear must be an int in [1, 2**63 - 1], "
                             f"got {self.gear!r}")
        object.__setattr__(self, "gear", int(self.gear))
        for key in ("capture_seconds", "replay_seconds"):
            object.__setattr__(self, key, _bounded(key, getattr(self, key), MAX_MEASURED_SECONDS))
        object.__setattr__(self, "graph_bytes",
                           int(_bounded("graph_bytes", self.graph_bytes, MAX_GRAPH_BYTES)))


def _bounded(key: str, value: Any, high: float) -> float:
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or not 0 <= value <= high:
        raise ShapeError(f"measurement {key} must be a number in [0, {high:g}], got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Line:
    """a + b·x, a and b >= 0."""

    a: float = 0.0
    b: float = 0.0

    def __call__(self, x: np.ndarray | int) -> np.ndarray:
        return self.a + self.b * np.asarray(x, dtype=float)

    @staticmethod
    def fit(x: np.ndarray, y: np.ndarray) -> Line:
        """Least squares over (x, y), then b and a clipped at 0; a constant for one x."""
        if x.size == 0:
            return Line()
        if np.unique(x).size < 2:
            return Line(max(float(np.mean(y)), 0.0))
        b, a = (float(c) for c in np.polyfit(x.astype(float), y, 1))
        if b < 0:  # falling with the gear: a constant
            return Line(max(float(np.mean(y)), 0.0))
        return Line(max(a, 0.0), b)


@dataclass(frozen=True)
class Curve:
    """Seconds per chunk of each size: monotone non-decreasing through (`gears`, `seconds`),
    linear between them and beyond the ends (the end segments' slopes), never negative."""

    gears: tuple[int, ...]
    seconds: tuple[float, ...]

    def __call__(self, x: np.ndarray | int) -> np.ndarray:
        g, s = np.asarray(self.gears, float), np.asarray(self.seconds, float)
        x = np.asarray(x, dtype=float)
        y = np.interp(x, g, s)
        if g.size >= 2:
            lo = (s[1] - s[0]) / (g[1] - g[0])
            hi = (s[-1] - s[-2]) / (g[-1] - g[-2])
            y = np.where(x < g[0], s[0] - lo * (g[0] - x), y)
            y = np.where(x > g[-1], s[-1] + hi * (x - g[-1]), y)
        return np.maximum(y, 0.0)


@dataclass(frozen=True)
class DimCosts:
    """One dim's fitted costs: `replay` seconds per chunk (None until MIN_GEARS distinct gears
    are measured), `capture` seconds per gear (None without a measurement), graph `bytes` per
    gear, and how many measurements they rest on."""

    replay: Curve | None
    capture: Curve | None
    bytes: Line
    measurements: int

    def summary(self) -> dict[str, Any]:
        """JSON-ready: the fits' figures (each curve as its points, gear -> seconds)."""
        return {"measurements": self.measurements, "replay_seconds": _points(self.replay),
                "capture_seconds": _points(self.capture),
                "graph_bytes": {"a": self.bytes.a, "b": self.bytes.b}}


def _points(curve: Curve | None) -> dict[int, float] | None:
    return None if curve is None else dict(zip(curve.gears, curve.seconds, strict=True))


def fit(measurements: Iterable[Measurement]) -> DimCosts:
    """The costs of one dim from its measurements (any order, any number)."""
    ms = list(measurements)
    if not ms:
        return DimCosts(None, None, Line(), 0)
    gear = np.array([m.gear for m in ms], np.int64)
    gears = np.unique(gear)[-MAX_POINTS:]

    def medians(values: list[float]) -> np.ndarray:
        v = np.asarray(values, float)
        return np.array([np.median(v[gear == g]) for g in gears])

    counts = np.array([(gear == g).sum() for g in gears], float)
    points = tuple(int(g) for g in gears)

    def curve(values: list[float]) -> Curve:
        return Curve(points, tuple(map(float, isotonic(medians(values), counts))))

    replay = curve([m.replay_seconds for m in ms]) if gears.size >= MIN_GEARS else None
    return DimCosts(replay, curve([m.capture_seconds for m in ms]),
                    Line.fit(gears, medians([float(m.graph_bytes) for m in ms])), len(ms))


def isotonic(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence nearest `y` in weighted least squares (pool adjacent
    violators): each pooled block takes its weighted mean."""
    blocks: list[list[float]] = []  # [mean, weight, length]
    for value, weight in zip(y.tolist(), w.tolist(), strict=True):
        blocks.append([value, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks.pop()
            total = w1 + w2
            blocks.append([(m1 * w1 + m2 * w2) / total if total else (m1 + m2) / 2, total,
                           n1 + n2])
    return np.repeat([b[0] for b in blocks], [b[2] for b in blocks])


@dataclass(frozen=True)
class Prices:
    """What plan mode prices one dim's moves with: `replay` seconds per chunk (None: the Dim's
    own `cost` is in seconds), `capture` seconds per gear and per worker (measured: a Curve; a
    model: a Line), `workers` that each capture a gear added, graph `bytes` per gear and
    worker, the device's `headroom` in bytes under its budget (None: no budget), and the
    bytes of the profile's static `buffers` on each worker as a Line in this dim's largest gear
    (`buffer_line`; Line(): not reported, not counted)."""

    capture: Line | Curve
    workers: int = 1
    replay: Curve | None = None
    bytes: Line = Line()
    headroom: float | None = None
    buffers: Line = Line()

    def work(self, dim: Dim) -> Any:
        """Seconds of a chunk of each size: the measured curve, else the Dim's cost."""
        return self.replay if self.replay is not None else dim.work

    def capture_cost(self, gears: Iterable[int] | np.ndarray) -> float:
        """Device seconds to capture `gears` on every worker."""
        g = np.asarray(list(gears) if not isinstance(gears, np.ndarray) else gears, float)
        return float(self.capture(g).sum()) * self.workers if g.size else 0.0

    def gear_bytes(self, gears: np.ndarray) -> np.ndarray:
        """The bytes a graph of each of `gears` holds, on every worker."""
        return self.bytes(gears.astype(float)) * self.workers

    def held_bytes(self, gears: Iterable[int]) -> float:
        g = np.asarray(list(gears), float)
        return float(self.bytes(g).sum()) * self.workers if g.size else 0.0

    def buffer_bytes(self, top: int) -> float:
        """The profile's static buffers on every worker with this dim's largest gear `top`
        (at most MAX_GRAPH_BYTES a worker; 0 where not reported)."""
        return min(float(self.buffers(top)), MAX_GRAPH_BYTES) * self.workers

    def buffer_growth(self, top: int, new_top: int) -> float:
        """What the buffers grow by, on every worker, when this dim's largest gear moves from
        `top` to `new_top` (0 where not reported)."""
        return self.buffer_bytes(new_top) - self.buffer_bytes(top) if new_top != top else 0.0


def buffer_line(cap: int, total: int, scaling: int) -> Line:
    """A profile's static buffers on one worker as a Line in one dim's largest gear, from its
    worker's report: `total` bytes with that dim's buffers sized at gear `cap`, `scaling` of
    them in the buffers with an axis on the dim (those grow with its largest gear; the others
    stay as they were at the report): (total - scaling) + scaling / cap · gear, exact for
    buffers linear in the dim. ShapeError unless 1 <= cap <= MAX_VALUE and
    0 <= scaling <= total <= MAX_GRAPH_BYTES (ints)."""
    for key, value, low, high in (("cap", cap, 1, MAX_VALUE), ("total", total, 0, MAX_GRAPH_BYTES),
                                  ("scaling", scaling, 0, total)):
        if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                or not low <= value <= high):
            raise ShapeError(f"buffers {key} must be an int in [{low}, {high}], got {value!r}")
    return Line(float(total - scaling), float(scaling) / float(cap))


def buffer_bytes(prices: Mapping[str, Prices], tops: Mapping[str, int]) -> float:
    """One profile's static buffers on every worker, counted once, with its dims' largest gears
    `tops`: the largest of its priced dims' `Prices.buffer_bytes` (each dim's Line is the
    buffers as that dim's largest gear moves, the others' as reported: exact for one dim, and
    for several while one alone has moved since the report); 0 where none was reported."""
    return max((p.buffer_bytes(tops[d]) for d, p in prices.items()
                if d in tops and (p.buffers.a > 0 or p.buffers.b > 0)), default=0.0)


def prices_for(costs: Mapping[str, DimCosts], workers: int, headroom: float | None = None,
               buffers: Mapping[str, Line] | None = None) -> dict[str, Prices]:
    """Per dim, the Prices of its fitted costs once its replay curve exists (a dim without
    one is decided unpriced), with its `buffers` Line where reported."""
    return {d: Prices(c.capture, max(workers, 1), c.replay, c.bytes, headroom,
                      (buffers or {}).get(d, Line()))
            for d, c in costs.items() if c.replay is not None and c.capture is not None}


def spent(prices: Mapping[str, Prices], before: Mapping[str, Any],
          after: Mapping[str, Any]) -> float:
    """Bytes a decision takes from the headroom: per priced dim, its graphs' bytes on `after`'s
    gears less on `before`'s (each a `DimGears`), on every worker, and what the profile's
    static buffers grow by (`buffer_bytes`, at the largest gears of each)."""
    both = [d for d in prices if d in before and d in after]
    return sum(prices[d].held_bytes(after[d].gears) - prices[d].held_bytes(before[d].gears)
               for d in both) + (
        buffer_bytes(prices, {d: after[d].gears[-1] for d in both if after[d].gears})
        - buffer_bytes(prices, {d: before[d].gears[-1] for d in both if before[d].gears}))
