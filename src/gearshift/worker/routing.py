"""The request path of a profile: `Route`, the gears in use with their lookup tables, `Router`.

`Router.route(**sizes)` is the request path: one version check (adopting a changed snapshot on
the spot, through its `Host`), a gear lookup per dim on the gears in use, one ring record; it
never captures, blocks or raises because of the controller. A route's chunks follow
`dims.chunks_for`, at most MAX_CHUNKS per dim (what a record counts): a split into more runs
eagerly (an EAGER record), so no request builds a chunk tuple larger than that.

The gears in use from one snapshot (`_InUse`) and their lookup tables never change once built;
the profile replaces them whole, by one reference assignment, so a request reads them once and
sees one snapshot's gears. The Route of a request that fits one gear per dim is made once per
gear combination and shared by every request it fits (`_RouteCache`): a Route and its chunks
are read-only.

`Router.record(**sizes)` is the record-only path, for a worker that runs an engine's own graphs
and only feeds the controller: the same checks and one ring record (`Kind.RECORDED`, no chunk:
no gearshift graph ran), with no gear lookup and no version check.

Fast path (`_specialised`): each profile gets a `route` generated for its dims, the way
namedtuple and dataclasses generate methods: the dims are keyword parameters and the check
that each is an int within [min, largest gear] is unrolled. Every other request (coerced,
split, eager, bad) takes the generic path, with the same routes, records and errors. Binding to
parameters, no loop and no Route built per request halve the Python work of a request
(`gearshift bench hotpath`).
"""

from __future__ import annotations

import array
import functools
import keyword
import math
from bisect import bisect_left
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, NamedTuple

from gearshift.core.dims import Dim, Gears, check_profile, chunks_for
from gearshift.errors import ShapeError
from gearshift.shm import ring
from gearshift.shm.ring import MAX_DIMS, Kind
from gearshift.worker.interfaces import Host

MAX_CHUNKS = 0xFFFF  # a record's chunk count is 16 bits
LOOKUP_MAX = 1 << 16  # dims with gears up to this route by an index array (2 bytes per value)
_SHAPE, _EAGER = int(Kind.SHAPE), int(Kind.EAGER)  # plain ints pack faster than enum members


class Route(NamedTuple):
    """How one request runs: the snapshot version it was routed on and, per dim, the gear of
    every chunk (largest first; `()` on a non-splittable dim over its largest gear: eager)."""

    version: int
    chunks: Mapping[str, Gears]  # read-only: Routes are shared by the requests they fit

    @property
    def gears(self) -> dict[str, int | None]:
        """Per dim, the gear it runs at (its largest chunk's), None when eager."""
        return {d: c[0] if c else None for d, c in self.chunks.items()}

    @property
    def eager(self) -> bool:
        return not all(self.chunks.values())

    def __reduce__(self) -> tuple[type[Route], tuple[int, dict[str, Gears]]]:
        """Pickles with its chunks as a dict (a read-only mapping does not pickle)."""
        return Route, (self.version, dict(self.chunks))


_new_route = tuple.__new__  # builds a Route without the Python-level __new__ of NamedTuple


class _InUse:
    """The gears in use from one snapshot; `active` (under the profile's lock) counts the
    requests in flight on them, `epoch` numbers the profile's adoptions. `table` has per dim
    (name, min, largest gear, index): `index[raw]` is the position of the smallest gear >= raw
    times the dim's stride, so a request whose dims all fit their gears sums them into the key
    of its Route in `routes`; `bounds` is `table` flat without the names (the specialised
    route's). `meta` is the record word of such a request (`ring.meta`)."""

    __slots__ = (
        "active", "bounds", "epoch", "gears", "meta", "record_meta", "routes", "table", "version"
    )

    def __init__(
        self, version: int, gears: dict[str, Gears], dims: Mapping[str, Dim], epoch: int, pid: int
    ) -> None:
        self.version, self.gears, self.epoch, self.active = version, gears, epoch, 0
        self.meta = ring.meta(pid, version, Kind.SHAPE, len(dims))
        self.record_meta = ring.meta(pid, version, Kind.RECORDED, len(dims))  # Router.record's
        counts = [len(gears[n]) for n in dims]
        strides = [math.prod(counts[i + 1 :]) for i in range(len(counts))]  # mixed radix
        self.table = tuple(
            (n, d.min, gears[n][-1], _lookup(gears[n], stride))
            for (n, d), stride in zip(dims.items(), strides, strict=True)
        )
        self.bounds = tuple(x for row in self.table for x in row[1:])
        self.routes = _RouteCache(
            version, {n: (gears[n], k) for n, k in zip(dims, strides, strict=True)}
        )


class _RouteCache(dict[int, "Route"]):
    """The one-chunk-per-dim Routes of some gears in use by key (sum of gear position x
    stride), made on first use and shared by every request they fit: a Route and its chunks
    are read-only."""

    def __init__(self, version: int, axes: dict[str, tuple[Gears, int]]) -> None:
        super().__init__()
        self.version, self.axes = version, axes

    def __missing__(self, key: int) -> Route:
        chunks = {
            n: (gears[key // stride % len(gears)],) for n, (gears, stride) in self.axes.items()
        }
        route = self[key] = _new_route(Route, (self.version, MappingProxyType(chunks)))
        return route


@functools.lru_cache(maxsize=64)  # read-only tables, shared by the _InUse of equal gears
def _lookup(gears: Gears, stride: int) -> Sequence[int]:
    """`index[raw]` = stride x the position of the smallest gear >= raw, for raw in 1..largest
    gear: an array of ints (one subscript) when the largest gear is at most LOOKUP_MAX, else a
    bisecting view. An array holds no references, so the garbage collector never walks it: a
    list of one chunk per raw value cost a collection 0.2-1.5 ms per 64 tables of 8192, inside
    whichever request set it off."""
    if gears[-1] > LOOKUP_MAX:
        return _Bisect(gears, stride)
    top = (len(gears) - 1) * stride
    index = array.array("H" if top < 1 << 16 else "I" if top < 1 << 32 else "Q", [0])
    for i, (low, gear) in enumerate(zip((0, *gears), gears, strict=False)):
        index += array.array(index.typecode, [i * stride]) * (gear - low)
    return index


class _Bisect:
    def __init__(self, gears: Gears, stride: int) -> None:
        self.gears, self.stride = gears, stride

    def __getitem__(self, raw: int) -> int:
        return bisect_left(self.gears, raw) * self.stride


_MISSING: Any = object()  # a dim the caller did not pass
_ROUTE = """
def route(*, {params}, **_unknown):
    if _host.region.version() != _host._seen:
        _host._refresh()
    _u = _router._in_use
    {bounds} = _u.bounds
    if {fits} and not _unknown:
        _route = _u.routes[{key}]
        _write(_now(), {values}, _u.meta, _single)
        return _route
    _sizes = {{{given}, **_unknown}}
    if {missing}:
        _sizes = {{n: v for n, v in _sizes.items() if v is not _MISSING}}
    return _router._route_checked(_u, _sizes)
"""


_RECORD = """
def record(*, {params}, **_unknown):
    if {fits} and not _unknown:
        _write(_now(), {values}, _router._in_use.record_meta, 0)
        return
    _sizes = {{{given}, **_unknown}}
    if {missing}:
        _sizes = {{n: v for n, v in _sizes.items() if v is not _MISSING}}
    _router._record_checked(_sizes)
"""


def _generated(router: Router, name: str, template: str,
               **fields: str) -> Callable[..., Any] | None:
    """`router.<name>` made from `template` for its dims (see the module docstring), or None
    when a dim name cannot be a parameter of it; `fields` fill the template's own slots."""
    names = list(router.dims)
    if not all(map(_parameter, names)):
        return None
    source = template.format(
        params=", ".join(f"{n}=_MISSING" for n in names),
        values=", ".join(names + ["0"] * (MAX_DIMS - len(names))),
        given=", ".join(f"{n!r}: {n}" for n in names),
        missing=" or ".join(f"{n} is _MISSING" for n in names),
        **fields,
    )
    scope = {
        "__name__": __name__,
        "_MISSING": _MISSING,
        "_type": type,
        "_int": int,
        "_host": router._host,
        "_router": router,
        "_write": router._write,
        "_now": router._now_ns,
        "_single": router._single,
    }
    exec(source, scope)  # names checked above: the way dataclasses and namedtuple do it
    fn = scope[name]
    fn.__doc__, fn.__qualname__ = getattr(Router, name).__doc__, f"Profile({router.name!r}).{name}"
    return fn


def _specialised_record(router: Router) -> Callable[..., None] | None:
    """`router.record` generated for its dims as `route` is, its bounds inlined."""
    return _generated(router, "record", _RECORD, fits=" and ".join(
        f"_type({n}) is _int and {d.min} <= {n} <= {d.max}" for n, d in router.dims.items()))


def _specialised(router: Router) -> Callable[..., Route] | None:
    """`router.route` generated for its dims, its bounds read from the gears in use."""
    dims = list(enumerate(router.dims))
    return _generated(
        router, "route", _ROUTE,
        bounds=", ".join(f"_l{i}, _t{i}, _i{i}" for i, _ in dims),
        fits=" and ".join(f"_type({n}) is _int and _l{i} <= {n} <= _t{i}" for i, n in dims),
        key=" + ".join(f"_i{i}[{n}]" for i, n in dims),
    )


def _parameter(name: str) -> bool:
    """An ASCII identifier (Python NFKC-normalises others), no keyword, no `_` prefix (the
    generated route's own names have one)."""
    return name.isascii() and name.isidentifier() and not keyword.iskeyword(name) and name[0] != "_"


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
        initial = {n: d.initial_gears for n, d in self.dims.items()}
        self._in_use = _InUse(0, initial, self.dims, 0, pid)
        self._generate()

    def _generate(self) -> None:
        """`route` and `record` generated for the dims, bound to `_write` (when they can be)."""
        if (route := _specialised(self)) is not None:
            self.route = route  # type: ignore[method-assign]
        if (record := _specialised_record(self)) is not None:
            self.record = record  # type: ignore[method-assign]

    def rebind(self, write: Callable[..., bool]) -> None:
        """Record through `write` from now on (the client's ring, once it has one): a request
        already in the old route still records through the old writer, which forwards."""
        self._write = write
        self._generate()

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
        self._record_checked(sizes)

    def _record_checked(self, sizes: Mapping[str, object]) -> None:
        if len(sizes) != self._ndim:
            raise self._mismatch(sizes)
        values = [0] * MAX_DIMS
        for i, (name, spec) in enumerate(self.dims.items()):
            values[i] = self._checked(name, spec, sizes)
        self._write(self._now_ns(), *values, self._in_use.record_meta, 0)

    def _route(self, in_use: _InUse, sizes: Mapping[str, int]) -> Route:
        if len(sizes) == self._ndim:  # the common case: ints within the gears, one chunk each
            key, values = 0, [0] * MAX_DIMS
            for i, (name, low, top, index) in enumerate(in_use.table):
                raw = sizes.get(name)
                if type(raw) is not int or raw < low or raw > top:
                    break
                key += index[raw]
                values[i] = raw
            else:
                route = in_use.routes[key]
                self._write(self._now_ns(), *values, in_use.meta, self._single)
                return route
        return self._route_checked(in_use, sizes)

    def _route_checked(self, in_use: _InUse, sizes: Mapping[str, object]) -> Route:
        """`_route` for any sizes: coerced, bounds checked, split or eager over the gears."""
        if len(sizes) != self._ndim:
            raise self._mismatch(sizes)
        chunks, values, runs, kind = {}, [0] * MAX_DIMS, [], _SHAPE
        for i, (name, spec) in enumerate(self.dims.items()):
            values[i] = raw = self._checked(name, spec, sizes)
            gears = in_use.gears[name]
            if spec.splittable and -(-raw // gears[-1]) > MAX_CHUNKS:
                c = ()  # more chunks than a record counts: eager, recorded as such
            else:
                c = chunks_for(gears, raw, spec.splittable)
            chunks[name] = c
            runs.append(len(c))
            kind = kind if c else _EAGER
        meta = in_use.meta
        if kind != _SHAPE:
            meta = ring.meta(self.id, in_use.version, kind, self._ndim)
        self._write(self._now_ns(), *values, meta, ring.counts(runs))
        return _new_route(Route, (in_use.version, MappingProxyType(chunks)))

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
