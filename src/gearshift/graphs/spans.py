"""A route's chunks as the spans of one call (`transform.Span`, `Tiling`): `tiling` for any
route, `OneChunk` for the common one of one chunk per dim, whose spans it keeps by (variant,
sizes) so that a call of sizes seen before makes none (a frozen dataclass costs a microsecond
or so to build). A route that does not cover the call exactly (a chunk past its rows, or rows
past its chunks: a route made for other sizes) is refused with ShapeError, never run."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

from gearshift.core.dims import Gears, Variant
from gearshift.errors import ShapeError
from gearshift.graphs.transform import Chunk, Span, Tiling

MAX_KEPT = 4096  # one-chunk spans kept (once full, forgotten and made anew)


def tiling(chunks: Mapping[str, Gears], sizes: Mapping[str, int]) -> Tiling | None:
    """The spans of a route's chunks for a call of `sizes`; None when a dim runs eagerly."""
    spans = {}
    for dim, gears in chunks.items():
        if not gears:
            return None
        raw, starts = sizes[dim], itertools.accumulate(gears, initial=0)
        if not sum(gears[:-1]) < raw <= sum(gears):
            raise ShapeError(f"a route's chunks {list(gears)} on {dim} do not cover {raw} rows")
        spans[dim] = tuple(Span(s, min(g, raw - s), g) for s, g in zip(starts, gears, strict=False))
    return Tiling(spans)


class OneChunk(dict[tuple[Variant, tuple[int, ...]], Chunk]):
    """The chunk of a one-chunk call by (variant, raw sizes in dim order), made by the first
    call and kept for the next (at most MAX_KEPT; a chunk is read-only)."""

    def __init__(self, names: tuple[str, ...]) -> None:
        super().__init__()
        self.names = names

    def __missing__(self, at: tuple[Variant, tuple[int, ...]]) -> Chunk:
        if len(self) >= MAX_KEPT:
            self.clear()
        variant, sizes = at
        for d, n, g in zip(self.names, sizes, variant, strict=True):
            if n > g:
                raise ShapeError(f"a route's gear {g} on {d} is smaller than the call's {n}")
        chunk = self[at] = {
            d: Span(0, n, g) for d, n, g in zip(self.names, sizes, variant, strict=True)
        }
        return chunk
