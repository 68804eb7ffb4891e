"""The request path of a profile: the gears in use (`_InUse`) and `Router`, which finds the
`Route` (`core.dims`) that the profile's runner replays as is: one lookup per request.

`Router.route(**sizes)` is the request path: one version check (adopting a changed snapshot on
the spot, through its `Host`), the smallest gear >= each dim's raw size (nano-vllm's
`next(g for g in gears if g >= raw)`: one subscript of a table of gear positions built with
the gears in use, or `bisect_left` for very large gears), one ring record; it never
captures, blocks or raises because of the controller. A request of ints within [min, largest
gear] on every dim runs one chunk per dim: its gear positions, in mixed radix, key the Route
of its gear combination, made by the first such request and shared by every later one (a Route
and its chunks are read-only). Any other request (a size to coerce, a split, an eager dim, a
bad shape) is checked dim by dim and chunked by `dims.chunks_for`, at most MAX_CHUNKS per dim
(what a record counts): a split into more runs eagerly (an EAGER record), so no request builds
a chunk tuple larger than that. Same errors either way.

The gears in use from one snapshot (`_InUse`) never change once built (only their cache of
Routes fills); the profile replaces them whole, by one reference assignment, so a request reads
them once and sees one snapshot's gears.

`Router.record(**sizes)` is the record-only path, for a worker that runs an engine's own graphs
and only feeds the controller: the same checks and one ring record (`Kind.RECORDED`, no chunk:
no gearshift graph ran), with no gear lookup and no version check.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left
from collections.abc import Callable, Mapping
from types import MappingProxyType

from gearshift.core.dims import Dim, Gears, Route, check_profile, chunks_for, route_of
from gearshift.errors import ShapeError
from gearshift.shm import ring
from gearshift.shm.ring import MAX_DIMS, Kind
from gearshift.worker.interfaces import Host

__all__ = ["MAX_CHUNKS", "Route", "Router", "checked_dims"]

MAX_CHUNKS = 0xFFFF  # a record's chunk count is 16 bits
TABLE_MAX = 1 << 16  # dims whose gears are all below it find them by a table (`_positions`)
_SHAPE, _EAGER = int(Kind.SHAPE), int(Kind.EAGER)  # plain ints compare faster than members
assert MAX_DIMS == 4  # a record's value slots: `write(t_ns, v0, v1, v2, v3, ...)`, the lists below


class _InUse:
    """The gears in use from one snapshot; `active` (under the profile's lock) counts the
    requests in flight on them, `epoch` numbers the profile's adoptions. `table` has per dim,
    in the profile's dim order, (position, name, min, positions, stride), `positions[raw]`
    the position of raw's gear among the dim's gears (`_positions`): a request of one chunk
    per dim is keyed by the sum of its gear positions times their strides (mixed radix), and
    `routes` holds the Route of each key once a request has used it. `meta` is the record word
    of a routed request (`ring.meta`), `record_meta` that of a recorded one."""

    __slots__ = ("active", "epoch", "gears", "meta", "record_meta", "routes", "table", "version")

    def __init__(
        self, version: int, gears: dict[str, Gears], dims: Mapping[str, Dim], epoch: int, pid: int
    ) -> None:
        self.version, self.gears, self.epoch, self.active = version, gears, epoch, 0
        self.meta = ring.meta(pid, version, Kind.SHAPE, len(dims))
        self.record_meta = ring.meta(pid, version, Kind.RECORDED, len(dims))
        counts = [len(gears[n]) for n in dims]
        strides = [math.prod(counts[i + 1 :]) for i in range(len(counts))]  # mixed radix
        radix = tuple((n, gears[n], stride) for n, stride in zip(dims, strides, strict=True))
        self.table = tuple(
            (i, n, dims[n].min, _positions(g), stride) for i, (n, g, stride) in enumerate(radix)
        )
        self.routes = _Routes(version, radix)


def _positions(gears: Gears) -> array[int] | _Bisection:
    """The gear positions of raw sizes 0 to the largest gear: `positions[raw]` is
    `bisect_left(gears, raw)`, IndexError past the largest gear. A table of 16-bit ints (one
    subscript; no object per raw size for a collection to walk) for gears below TABLE_MAX,
    bisection above."""
    if gears[-1] >= TABLE_MAX:
        return _Bisection(gears)
    table, below = array("H", [0]), 0  # raw 0; then the raws up to each gear: its position
    for position, gear in enumerate(gears):
        table.extend(array("H", [position]) * (gear - below))
        below = gear
    return table


class _Bisection:
    """`_positions` by bisection: for a dim whose largest gear is too large for a table."""

    __slots__ = ("gears",)

    def __init__(self, gears: Gears) -> None:
        self.gears = gears

    def __getitem__(self, raw: int) -> int:
        if raw > self.gears[-1]:
            raise IndexError(raw)
        return bisect_left(self.gears, raw)


class _Routes(dict[int, Route]):
    """The Routes of some gears in use by key (`_InUse`), each made by the first request of
    its gears and shared by every later one: a Route and its chunks are read-only."""

    def __init__(self, version: int, radix: tuple[tuple[str, Gears, int], ...]) -> None:
        super().__init__()
        self.version, self.radix = version, radix  # per dim: (name, gears, stride)

    def __missing__(self, key: int) -> Route:
        variant = tuple(gears[key // stride % len(gears)] for _, gears, stride in self.radix)
        chunks = {n: (g,) for (n, *_), g in zip(self.radix, variant, strict=True)}
        route = self[key] = Route(self.version, MappingProxyType(chunks), variant)
        return route


def checked_dims(name: str, dims: Mapping[str, Dim]) -> dict[str, Dim]:
    """`dims` as a dict, or ShapeError (`dims.check_profile`: the controller's rule too)."""
    return check_profile(name, dims)


class Router:
    """A profile's request path (the base of `Profile`): routes on the gears in use,
    `_in_use`, which the profile replaces when it adopts a snapshot, and records every request
    in its host's ring."""

    def __init__(self, host: Host, pid: int, name: str, dims: Mapping[str, Dim]) -> None:
        self.id, self.name, self.dims = pid, name, checked_dims(name, dims)
        self._host = host
        self._write, self._now_ns = host.ring.write, host.clock.now_ns
        self._ndim = len(self.dims)
        self._single = ring.counts([1] * self._ndim)  # one chunk per dim
        self._specs = tuple(  # per dim: (position, name, min, max, Dim)
            (i, n, d.min, d.max, d) for i, (n, d) in enumerate(self.dims.items())
        )
        initial = {n: d.initial_gears for n, d in self.dims.items()}
        self._in_use = _InUse(0, initial, self.dims, 0, pid)

    def _rebind(self, write: Callable[..., bool]) -> None:
        """Record through `write` from now on (the client's ring, once it has one): a request
        already in the old route still records through the old writer, which forwards."""
        self._write = write

    @property
    def gears(self) -> dict[str, Gears]:
        """Current gears per dim, from the snapshot in use."""
        return dict(self._in_use.gears)

    @property
    def version(self) -> int:
        """The version of the snapshot in use (0: initial gears)."""
        return self._in_use.version

    def route(self, **sizes: int) -> Route:
        """Route one request of these raw sizes and record it; ShapeError on a bad shape."""
        host = self._host
        if host.region.version() != host._seen:
            host._refresh()
        return self._route(self._in_use, sizes)

    def record(self, **sizes: int) -> None:
        """Record one request of these raw sizes with no routing (no gear lookup, no Route),
        for a worker that runs an engine's own graphs; ShapeError on a bad shape, as route."""
        v0, v1, v2, v3 = self._values(sizes)
        self._write(self._now_ns(), v0, v1, v2, v3, self._in_use.record_meta, 0)

    def _route(self, in_use: _InUse, sizes: Mapping[str, object]) -> Route:
        """Route `sizes` on `in_use` and record it (the module docstring): ints within
        [min, largest gear] on every dim take the shared Route of their gear combination."""
        if len(sizes) == self._ndim:
            values, key = [0, 0, 0, 0], 0  # MAX_DIMS slots (a literal costs less than [0] * 4)
            for i, name, low, positions, stride in in_use.table:
                try:  # free unless raised: subscripts cost less than `get` and `bisect_left`
                    raw = sizes[name]
                    if type(raw) is not int or raw < low:
                        break
                    key += positions[raw] * stride
                except (KeyError, IndexError):  # a dim missing, or raw over its largest gear
                    break
                values[i] = raw
            else:
                v0, v1, v2, v3 = values  # plain arguments: a call with `*` costs more
                self._write(self._now_ns(), v0, v1, v2, v3, in_use.meta, self._single)
                return in_use.routes[key]
        return self._route_any(in_use, sizes)

    def _route_any(self, in_use: _InUse, sizes: Mapping[str, object]) -> Route:
        """`_route` for any sizes: coerced, bounds checked, split or eager over the gears."""
        v0, v1, v2, v3 = values = self._values(sizes)
        chunks, runs, kind = {}, [], _SHAPE
        for (name, spec), raw in zip(self.dims.items(), values, strict=False):
            gears = in_use.gears[name]
            if spec.splittable and -(-raw // gears[-1]) > MAX_CHUNKS:
                c: Gears = ()  # more chunks than a record counts: eager, recorded as such
            else:
                c = chunks_for(gears, raw, spec.splittable)
            chunks[name] = c
            runs.append(len(c))
            kind = kind if c else _EAGER
        meta = in_use.meta
        if kind != _SHAPE:
            meta = ring.meta(self.id, in_use.version, kind, self._ndim)
        self._write(self._now_ns(), v0, v1, v2, v3, meta, ring.counts(runs))
        return route_of(in_use.version, MappingProxyType(chunks))

    def _values(self, sizes: Mapping[str, object]) -> list[int]:
        """The raw sizes in dim order, each checked (`_checked`), then 0 up to MAX_DIMS (a
        record's value slots); ShapeError on unknown or missing dims."""
        if len(sizes) != self._ndim:
            raise self._mismatch(sizes)
        values = [0, 0, 0, 0]  # MAX_DIMS slots
        for i, name, low, high, spec in self._specs:
            raw = sizes.get(name)
            if type(raw) is not int or raw < low or raw > high:
                raw = self._checked(name, spec, sizes)
            values[i] = raw
        return values

    def _checked(self, name: str, spec: Dim, sizes: Mapping[str, object]) -> int:
        """`sizes[name]` as an int within the dim's bounds; ShapeError otherwise."""
        raw = sizes.get(name)
        if type(raw) is not int:
            raw = self._coerce(name, sizes)
        if raw < spec.min or raw > spec.max:
            raise ShapeError(f"{self.name}: {name}={raw} is outside [{spec.min}, {spec.max}]")
        return raw

    def _coerce(self, name: str, sizes: Mapping[str, object]) -> int:
        if name not in sizes:
            raise self._mismatch(sizes)
        self.dims[name].check(f"{self.name}: {name}", sizes[name])  # type: ignore[arg-type]
        return int(sizes[name])  # type: ignore[call-overload]

    def _mismatch(self, sizes: Mapping[str, object]) -> ShapeError:
        unknown = sorted(set(sizes) - self.dims.keys())
        missing = [d for d in self.dims if d not in sizes]
        return ShapeError(
            f"{self.name}: expected sizes for dims {list(self.dims)}; unknown {unknown}, "
            f"missing {missing}"
        )
