"""Dims and gears: how a raw size maps onto a gear set.

A dim's gears are a sorted tuple of distinct positive ints within `[min, max]`.
A raw value `r` (`min <= r <= max`) runs as:

- `r <= largest gear`: one chunk, the smallest gear >= r (padded to it);
- `r > largest`, splittable: `r // largest` full largest-gear chunks, plus the
  remainder mapped to its own gear (when non-zero);
- `r > largest`, not splittable: eager, no chunk, no padding (counted).

Padded work is the sum of the chunks' gears (`r` itself when eager).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from gearshift.errors import ShapeError

Gears = tuple[int, ...]
Variant = tuple[int, ...]  # one gear per dim of a profile, in its dim order: one graph


class Route(NamedTuple):
    """How one request runs, as a profile's router found it and its runner replays it as is
    (or another process's runner of the same profile: it pickles): the snapshot version it was
    routed on; per dim (in the profile's order) the gear of every chunk, largest first (`()` on
    a non-splittable dim over its largest gear: eager); and `variant`, the one graph it runs
    when every dim is one chunk (its gears in dim order), else None."""

    version: int
    chunks: Mapping[str, Gears]  # read-only where shared by the requests it fits
    variant: Variant | None = None

    @property
    def gears(self) -> dict[str, int | None]:
        """Per dim, the gear it runs at (its largest chunk's), None when eager."""
        return {d: c[0] if c else None for d, c in self.chunks.items()}

    @property
    def eager(self) -> bool:
        return not all(self.chunks.values())

    def __reduce__(self) -> tuple[type[Route], tuple[int, dict[str, Gears], Variant | None]]:
        """Pickles with its chunks as a dict (a read-only mapping does not pickle)."""
        return Route, (self.version, dict(self.chunks), self.variant)


def route_of(version: int, chunks: Mapping[str, Gears]) -> Route:
    """The Route of these chunks, its `variant` set when every dim is one chunk."""
    one = all(len(c) == 1 for c in chunks.values())
    return Route(version, chunks, tuple(c[0] for c in chunks.values()) if one else None)
MAX_DIMS = 4  # dims of a profile: a ring record carries four values
MAX_VALUE = (1 << 63) - 1  # raw values and gears: a ring record's values are int64
MAX_NAME = 256  # characters of a profile's or a dim's name


@dataclass(frozen=True)
class Dim:
    """One dynamic axis kind of a profile.

    `gears` are the initial gears (default: the power-of-two ladder between
    `min` and `max`, plus `max`); `align` rounds gears the policy adds up to a
    multiple; `min`/`max` bound both raw values and gears. `cost` tells plan mode
    what a chunk of size x costs, as polynomial coefficients in x, lowest first
    (`work`): the default (0, 1) counts padded elements; prefill attention, whose
    cost grows as S^2, gives e.g. (c0, c1, c2), and the policy then minimises
    padded compute instead.

    Every field is checked on construction, by the client and the controller alike (a
    registration is rebuilt from its fields): ShapeError names the field. Numbers of other
    types (numpy's) are kept as Python ints and floats, so a Dim survives msgpack unchanged.
    Gears are kept sorted and distinct; `reordered` holds the gears as given when that
    changed them (None otherwise; not a field: the profile logs it once).
    """

    gears: Sequence[int] | None = None
    min: int = 1
    max: int = 8192
    align: int = 1
    splittable: bool = False
    pad_value: float = 0.0
    cost: Sequence[float] = (0.0, 1.0)

    def __post_init__(self) -> None:
        for name in ("min", "max", "align"):
            value = getattr(self, name)
            if _is_int(value) and value > MAX_VALUE:
                raise ShapeError(f"Dim.{name} {brief(value)} does not fit 64 bits (2**63 - 1)")
            if not _is_int(value) or value < 1:
                raise ShapeError(f"Dim.{name} must be a positive int, got {brief(value)}")
            object.__setattr__(self, name, int(value))
        if self.min > self.max:
            raise ShapeError(f"Dim.min {self.min} exceeds Dim.max {self.max}")
        if self.gears is not None:
            if isinstance(self.gears, (str, bytes, Mapping)) or not hasattr(self.gears, "__iter__"):
                raise ShapeError(f"Dim.gears must be a sequence of ints, got {brief(self.gears)}")
            gears = normalize_gears(self.gears)
            given = [int(g) for g in self.gears]  # ints: normalize_gears checked them
            if given != list(gears):
                object.__setattr__(self, "reordered", brief(given))
            if gears[0] < self.min or gears[-1] > self.max:
                raise ShapeError(f"Dim.gears {brief(list(gears))} fall outside "
                                 f"[{self.min}, {self.max}]")
            object.__setattr__(self, "gears", gears)
        if not isinstance(self.splittable, (bool, np.bool_)):
            raise ShapeError(f"Dim.splittable must be True or False, got {brief(self.splittable)}")
        object.__setattr__(self, "splittable", bool(self.splittable))
        pad = self.pad_value
        if not isinstance(pad, (int, float, np.integer, np.floating)) or not math.isfinite(pad):
            raise ShapeError(f"Dim.pad_value must be a finite number, got {brief(pad)}")
        object.__setattr__(self, "pad_value", int(pad) if _is_int(pad) or isinstance(pad, bool)
                           else float(pad))
        try:
            cost = () if isinstance(self.cost, (str, bytes)) else tuple(float(c) for c in self.cost)
        except (TypeError, ValueError):
            cost = ()
        with np.errstate(over="ignore"):
            top = np.polynomial.polynomial.polyval(float(self.max), cost) if cost else 0.0
        if (not cost or not all(np.isfinite(cost)) or min(cost) < 0 or not any(cost[1:])
                or not np.isfinite(top)):
            raise ShapeError(f"Dim.cost must be finite non-negative polynomial coefficients, "
                             f"lowest first, growing with x and finite at max; "
                             f"got {brief(self.cost)}")
        object.__setattr__(self, "cost", cost)

    reordered = None  # the gears as given, when sorting or de-duplicating changed them

    @property
    def initial_gears(self) -> Gears:
        return self.gears if self.gears is not None else ladder(self.min, self.max)

    def work(self, x: np.ndarray) -> np.ndarray:
        """The cost of chunks of sizes `x` (float64): the `cost` polynomial, increasing."""
        return np.polynomial.polynomial.polyval(np.asarray(x, np.float64), self.cost)

    def check(self, name: str, raw: int) -> None:
        """Raise ShapeError unless `raw` is an int within the bounds."""
        if isinstance(raw, bool) or not isinstance(raw, (int, np.integer)):
            raise ShapeError(f"{name}={raw!r}: expected an int")
        if not self.min <= raw <= self.max:
            raise ShapeError(f"{name}={raw} is outside [{self.min}, {self.max}]")

    def aligned(self, value: int) -> int:
        """`value` rounded up to a multiple of `align`, clamped to `[min, max]`."""
        up = -(-int(value) // self.align) * self.align
        return max(self.min, min(self.max, up))


def normalize_gears(gears: Sequence[int]) -> Gears:
    """Sorted distinct positive ints; ShapeError on anything else or on an empty set."""
    out = set()
    for g in gears:
        if not _is_int(g) or g < 1:
            raise ShapeError(f"gears must be positive ints, got {brief(g)}")
        out.add(int(g))
    if not out:
        raise ShapeError("a dim needs at least one gear")
    return tuple(sorted(out))


def check_profile(name: str, dims: Mapping[str, Dim]) -> dict[str, Dim]:
    """`dims` as a dict, or ShapeError: a profile has a name (a string of 1..MAX_NAME
    characters) and 1..MAX_DIMS dims, each such a name for a `Dim`. The client's and the
    controller's one rule."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
        raise ShapeError(f"a profile name is a non-empty string of at most {MAX_NAME} "
                         f"characters, got {brief(name)}")
    dims = dict(dims)
    if not 1 <= len(dims) <= MAX_DIMS:
        raise ShapeError(f"profile {name!r} needs 1 to {MAX_DIMS} dims, got {len(dims)}")
    for dim, spec in dims.items():
        if not isinstance(dim, str) or not 0 < len(dim) <= MAX_NAME or not isinstance(spec, Dim):
            raise ShapeError(f"profile {name!r}: {brief(dim)} must name a gs.Dim, "
                             f"got {brief(spec)}")
    return dims


def describe(dims: Mapping[str, Dim]) -> str:
    """A profile's dims as its error messages name them: `NAME=Dim(...)`, comma-separated."""
    return ", ".join(f"{name}={dim}" for name, dim in dims.items())


def redeclared(name: str, known: Mapping[str, Dim], dims: Mapping[str, Dim]) -> str:
    """Why profile `name`, known in this process with `known`, is refused with `dims`."""
    return (f"profile {name!r} is already registered in this process with other dims"
            f" ({describe(known)}); this call declares {describe(dims)}")


def brief(value: object, limit: int = 60) -> str:
    """`repr(value)` cut to `limit` characters: error messages never carry a whole input."""
    text = repr(value) if not isinstance(value, (str, bytes)) or len(value) <= limit \
        else repr(value[:limit])
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def ladder(low: int, high: int) -> Gears:
    """Powers of two within `[low, high]`, plus `high` itself."""
    out = {1 << k for k in range(high.bit_length()) if low <= 1 << k <= high}
    out.add(high)
    return tuple(sorted(out))


def gear_for(gears: Gears, raw: int) -> int | None:
    """Smallest gear >= raw, or None when raw exceeds the largest."""
    i = bisect.bisect_left(gears, raw)
    return gears[i] if i < len(gears) else None


def chunks_for(gears: Gears, raw: int, splittable: bool) -> Gears:
    """The gear of every chunk `raw` runs as; `()` means eager."""
    g = gear_for(gears, raw)
    if g is not None:
        return (g,)
    if not splittable:
        return ()
    top = gears[-1]
    full, rest = divmod(raw, top)
    tail = (gear_for(gears, rest),) if rest else ()
    return (top,) * full + tail  # type: ignore[return-value]


def padded_cost(dim: Dim, gears: Gears, raw: np.ndarray) -> np.ndarray:
    """Vectorised cost (`dim.work`) of each raw value on `gears`: the sum of its chunks'
    costs (its own cost when eager); with the default cost, `padded_work`."""
    if not dim.splittable:  # one chunk, or eager at the raw size
        return dim.work(padded_work(gears, raw, False))
    g = np.asarray(gears, dtype=np.int64)
    full, rest = np.divmod(np.asarray(raw, dtype=np.int64), g[-1])
    tail = g[np.minimum(np.searchsorted(g, rest), len(g) - 1)]
    return full * dim.work(g[-1]) + np.where(rest > 0, dim.work(tail), 0.0)


def padded_work(gears: Gears, raw: np.ndarray, splittable: bool) -> np.ndarray:
    """Vectorised padded work of each raw value (sum of its chunks; raw when eager)."""
    g = np.asarray(gears, dtype=np.int64)
    raw = np.asarray(raw, dtype=np.int64)
    top = g[-1]
    if splittable:  # raw <= top is the case full == 0 (or full == 1, rest == 0)
        full, rest = np.divmod(raw, top)
        tail = g[np.minimum(np.searchsorted(g, rest), len(g) - 1)]
        return full * top + np.where(rest > 0, tail, 0)
    return np.where(raw > top, raw, g[np.minimum(np.searchsorted(g, raw), len(g) - 1)])
