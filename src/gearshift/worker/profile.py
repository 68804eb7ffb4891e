"""A profile on a connected client: routing on the snapshot in use, and adopting new ones.

`route(**sizes)` is the request path: one version check (adopting a changed snapshot on the
spot), a gear lookup per dim on the gears in use, one ring record; it never captures, blocks
or raises because of the controller. A plan's chunks follow `dims.chunks_for`.

Its fast path (`_specialised`): each profile gets a `route` generated for its dims, the way
namedtuple and dataclasses generate methods: the dims are keyword parameters, the check that
each is an int within [min, largest gear] is unrolled, and such a request's Plan is its
state's for that gear combination, made once and shared (its chunks are read-only). Every
other request (coerced, split, eager, bad) takes the generic path, with the same plans,
records and errors. Binding to parameters, no loop and no Plan built per request halve the
Python work of a request (`gearshift bench hotpath`).

Adopting a snapshot (`Client.refresh`, on whichever thread sees the new version first; the
payload is decoded once for all profiles) builds a new `_State`, whose gears and lookup tables
never change after, and publishes it to request threads by one reference assignment under
`_lock`; an attached runner gets the new gears the same way. The client's swap thread then
calls `maintain()`: it warms the runner up (captures the variants of the gears in use, a few
per call; until one is ready the runner routes its chunks to the next larger ready variant, or
eagerly) and releases the graphs of removed gears once every request bracketed by
`request()`/`run()` that started on an older state has finished (the grace period).

Invariants: a request counts itself in its state's `active` under `_lock`, where the swap also
happens, so once a state is replaced no request can join it; a removal made by state `e` is
released only when no state older than `e` has a request in flight, and only if the gear is
not back in the gears in use.
"""

from __future__ import annotations

import array
import functools
import itertools
import keyword
import logging
import math
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from gearshift import protocol
from gearshift.core.dims import Dim, Gears, chunks_for, normalize_gears
from gearshift.errors import ShapeError, StateError
from gearshift.shm import ring
from gearshift.shm.ring import MAX_DIMS, Kind

if TYPE_CHECKING:
    from gearshift.worker.session import Client

log = logging.getLogger(__name__)
MAX_CHUNKS = 0xFFFF  # a record's chunk count is 16 bits
LOOKUP_MAX = 1 << 16  # dims with gears up to this route by an index array (2 bytes per value)
_SHAPE, _EAGER = int(Kind.SHAPE), int(Kind.EAGER)  # plain ints pack faster than enum members
WARM_BATCH = 8  # variants captured per maintain() call: the swap thread stays responsive


class Plan(NamedTuple):
    """How one request runs: the snapshot version it was routed on and, per dim, the gear of
    every chunk (largest first; `()` on a non-splittable dim over its largest gear: eager)."""

    version: int
    chunks: Mapping[str, Gears]  # read-only: Plans are shared by the requests they fit

    @property
    def gears(self) -> dict[str, int | None]:
        """Per dim, the gear it runs at (its largest chunk's), None when eager."""
        return {d: c[0] if c else None for d, c in self.chunks.items()}

    @property
    def eager(self) -> bool:
        return not all(self.chunks.values())

    def __reduce__(self) -> tuple[type[Plan], tuple[int, dict[str, Gears]]]:
        """Pickles with its chunks as a dict (a read-only mapping does not pickle)."""
        return Plan, (self.version, dict(self.chunks))


_new_plan = tuple.__new__  # builds a Plan without the Python-level __new__ of NamedTuple


class Runner(Protocol):
    """What a profile drives (an `AdaptiveRunner`): gears to plan on, warm-up, release, run."""

    gears: dict[str, Gears]
    transform: Any  # .check(tensors) -> raw size per dim

    def ready(self) -> list[tuple[int, ...]]: ...

    def capture(self, variants: Iterable[Mapping[str, int]]) -> int: ...

    def release(self, dim: str, gear: int) -> int: ...

    def run(self, tensors: Mapping[str, Any], sizes: Mapping[str, int] | None = None) -> Any: ...


class _State:
    """Gears in use from one snapshot; `active` (under the profile's lock) counts requests.
    `table` has per dim (name, min, largest gear, index): `index[raw]` is the position of the
    smallest gear >= raw times the dim's stride, so a request whose dims all fit their gears
    sums them into the key of its Plan in `plans`; `bounds` is `table` flat without the names
    (the specialised route's). `meta` is the record word of such a request (`ring.meta`)."""

    __slots__ = ("active", "bounds", "epoch", "gears", "meta", "plans", "table", "version")

    def __init__(
        self, version: int, gears: dict[str, Gears], dims: Mapping[str, Dim], epoch: int, pid: int
    ) -> None:
        self.version, self.gears, self.epoch, self.active = version, gears, epoch, 0
        self.meta = ring.meta(pid, version, Kind.SHAPE, len(dims))
        counts = [len(gears[n]) for n in dims]
        strides = [math.prod(counts[i + 1 :]) for i in range(len(counts))]  # mixed radix
        self.table = tuple(
            (n, d.min, gears[n][-1], _lookup(gears[n], stride))
            for (n, d), stride in zip(dims.items(), strides, strict=True)
        )
        self.bounds = tuple(x for row in self.table for x in row[1:])
        self.plans = _Plans(version, {n: (gears[n], k) for n, k in zip(dims, strides, strict=True)})


class _Plans(dict[int, "Plan"]):
    """The one-chunk-per-dim Plans of a state by key (sum of gear position x stride), made on
    first use and shared by every request they fit: a Plan and its chunks are read-only."""

    def __init__(self, version: int, axes: dict[str, tuple[Gears, int]]) -> None:
        super().__init__()
        self.version, self.axes = version, axes

    def __missing__(self, key: int) -> Plan:
        chunks = {
            n: (gears[key // stride % len(gears)],) for n, (gears, stride) in self.axes.items()
        }
        plan = self[key] = _new_plan(Plan, (self.version, MappingProxyType(chunks)))
        return plan


@functools.lru_cache(maxsize=64)  # read-only tables, shared by the states of equal gears
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
    if _client.region.version() != _client.seen:
        _client.refresh()
    _s = _profile._state
    {bounds} = _s.bounds
    if {fits} and not _unknown:
        _plan = _s.plans[{key}]
        _write(_now(), {values}, _s.meta, _single)
        return _plan
    _sizes = {{{given}, **_unknown}}
    if {missing}:
        _sizes = {{n: v for n, v in _sizes.items() if v is not _MISSING}}
    return _profile._route_checked(_s, _sizes)
"""


def _specialised(profile: Profile) -> Callable[..., Plan] | None:
    """`profile.route` generated for its dims (see the module docstring), or None when a dim
    name cannot be a parameter of it."""
    names = list(profile.dims)
    if not all(map(_parameter, names)):
        return None
    dims = list(enumerate(names))
    source = _ROUTE.format(
        params=", ".join(f"{n}=_MISSING" for n in names),
        bounds=", ".join(f"_l{i}, _t{i}, _i{i}" for i, _ in dims),
        fits=" and ".join(f"_type({n}) is _int and _l{i} <= {n} <= _t{i}" for i, n in dims),
        key=" + ".join(f"_i{i}[{n}]" for i, n in dims),
        values=", ".join(names + ["0"] * (MAX_DIMS - len(names))),
        given=", ".join(f"{n!r}: {n}" for n in names),
        missing=" or ".join(f"{n} is _MISSING" for n in names),
    )
    scope = {
        "__name__": __name__,
        "_MISSING": _MISSING,
        "_type": type,
        "_int": int,
        "_client": profile._client,
        "_profile": profile,
        "_write": profile._write,
        "_now": profile._now_ns,
        "_single": profile._single,
    }
    exec(source, scope)  # names checked above: the way dataclasses and namedtuple do it
    route = scope["route"]
    route.__doc__, route.__qualname__ = Profile.route.__doc__, f"Profile({profile.name!r}).route"
    return route


def _parameter(name: str) -> bool:
    """An ASCII identifier (Python NFKC-normalises others), no keyword, no `_` prefix (the
    generated route's own names have one)."""
    return name.isascii() and name.isidentifier() and not keyword.iskeyword(name) and name[0] != "_"


def checked_dims(name: str, dims: Mapping[str, Dim]) -> dict[str, Dim]:
    """`dims` as a dict, or ShapeError: a profile has a name and 1..4 named `Dim`s whose raw
    values fit a record (below 2**63)."""
    if not isinstance(name, str) or not name:
        raise ShapeError(f"a profile name is a non-empty string, got {name!r}")
    dims = dict(dims)
    if not 1 <= len(dims) <= MAX_DIMS:
        raise ShapeError(f"profile {name!r} needs 1 to {MAX_DIMS} dims, got {len(dims)}")
    for dim, spec in dims.items():
        if not isinstance(dim, str) or not dim or not isinstance(spec, Dim):
            raise ShapeError(f"profile {name!r}: {dim!r} must name a gs.Dim, got {spec!r}")
        if spec.max >= 1 << 63:
            raise ShapeError(f"profile {name!r}: {dim}.max {spec.max} does not fit 64 bits")
    return dims


class _Request:
    """`Profile.request`'s context (a class: a generator's costs twice as much per request).
    Enter counts the request in its state under the profile's lock, then routes it; leaving
    (also when routing raised) uncounts it and wakes the swap thread if that drained a
    replaced state."""

    __slots__ = ("profile", "sizes", "state")

    def __init__(self, profile: Profile, sizes: Mapping[str, int]) -> None:
        self.profile, self.sizes = profile, sizes

    def __enter__(self) -> Plan:
        profile = self.profile
        client = profile._client
        if client.region.version() != client.seen:
            client.refresh()
        with profile._lock:
            self.state = state = profile._state
            state.active += 1
        try:
            return profile._route(state, self.sizes)
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        profile, state = self.profile, self.state
        with profile._lock:
            state.active -= 1
            drained = not state.active and state is not profile._state
        if drained:
            profile._client.wake()


class Profile:
    """One named graph-compiled function of a client's device; made by `Client.profile`."""

    def __init__(self, client: Client, pid: int, name: str, dims: Mapping[str, Dim]) -> None:
        self.id, self.name, self.dims = pid, name, checked_dims(name, dims)
        self.registered = False
        self.rejected: Exception | None = None  # a registration the controller refused
        self._client = client
        self._write, self._now_ns = client.ring.write, client.clock.now_ns
        self._ndim = len(self.dims)
        self._single = ring.counts([1] * self._ndim)  # one chunk per dim
        self._lock = threading.Lock()
        self._state = _State(0, {n: d.initial_gears for n, d in self.dims.items()}, dims, 0, pid)
        self._draining: list[_State] = []  # replaced states with requests in flight
        self._releases: list[tuple[int, str, int]] = []  # (epoch that removed it, dim, gear)
        self._runner: Runner | None = None
        self._warm: _State | None = None  # the state whose variants are all captured
        if (route := _specialised(self)) is not None:
            self.route = route  # type: ignore[method-assign]

    @property
    def gears(self) -> dict[str, Gears]:
        """Current gears per dim, from the snapshot in use."""
        return dict(self._state.gears)

    @property
    def version(self) -> int:
        """The version of the snapshot in use (0: initial gears)."""
        return self._state.version

    # request path

    def route(self, **sizes: int) -> Plan:
        """Plan one request of these raw sizes and record it; ShapeError on a bad shape."""
        client = self._client
        if client.region.version() != client.seen:
            client.refresh()
        return self._route(self._state, sizes)

    def request(self, **sizes: int) -> _Request:
        """`route`, and count the request in flight until the block ends: graphs of gears a
        newer snapshot removes are kept until it is done. Bracket every graph run with it."""
        return _Request(self, sizes)

    def _route(self, state: _State, sizes: Mapping[str, int]) -> Plan:
        if len(sizes) == self._ndim:  # the common case: ints within the gears, one chunk each
            key, values = 0, [0] * MAX_DIMS
            for i, (name, low, top, index) in enumerate(state.table):
                raw = sizes.get(name)
                if type(raw) is not int or raw < low or raw > top:
                    break
                key += index[raw]
                values[i] = raw
            else:
                plan = state.plans[key]
                self._write(self._now_ns(), *values, state.meta, self._single)
                return plan
        return self._route_checked(state, sizes)

    def _route_checked(self, state: _State, sizes: Mapping[str, object]) -> Plan:
        """`_route` for any sizes: coerced, bounds checked, split or eager over the gears."""
        if len(sizes) != self._ndim:
            raise self._mismatch(sizes)
        chunks, values, runs, kind = {}, [0] * MAX_DIMS, [], _SHAPE
        for i, (name, spec) in enumerate(self.dims.items()):
            raw = sizes.get(name)
            if type(raw) is not int:
                raw = self._coerce(name, sizes)
            if raw < spec.min or raw > spec.max:
                raise ShapeError(f"{self.name}: {name}={raw} is outside [{spec.min}, {spec.max}]")
            values[i] = raw
            chunks[name] = c = chunks_for(state.gears[name], raw, spec.splittable)
            runs.append(min(len(c), MAX_CHUNKS))
            kind = kind if c else _EAGER
        meta = state.meta if kind == _SHAPE else ring.meta(self.id, state.version, kind, self._ndim)
        self._write(self._now_ns(), *values, meta, ring.counts(runs))
        return _new_plan(Plan, (state.version, MappingProxyType(chunks)))

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

    # graph runs

    def attach(self, runner: Runner) -> Runner:
        """Drive `runner` from this profile: it plans on the gears in use, the swap thread warms
        it up and releases removed gears after their grace period. Returns it."""
        if list(runner.gears) != list(self.dims):
            raise ShapeError(
                f"{self.name}: the runner's dims {list(runner.gears)} are not "
                f"{list(self.dims)} (in this order)"
            )
        with self._lock:
            self._runner = runner
            runner.gears = dict(self._state.gears)
        self._client.attached(runner)
        return runner

    def runner(
        self,
        fn: Callable[..., Any],
        inputs: Mapping[str, tuple[str | None, ...]],
        example: Mapping[str, Any],
        **options: Any,
    ) -> Runner:
        """Build an `AdaptiveRunner` of `fn` on this profile's dims and `attach` it; `inputs`
        binds input axes to symbols (see `Transform`), `example` gives static sizes and dtypes,
        `options` go to `Transform` (symbols, outputs). Imports torch."""
        from gearshift.graphs.adaptive import AdaptiveRunner
        from gearshift.graphs.transform import Transform

        return self.attach(AdaptiveRunner(Transform(fn, self.dims, inputs, **options), example))

    def run(self, /, **tensors: Any) -> Any:
        """`fn(**tensors)` through the attached runner, routed, recorded and bracketed."""
        runner = self._runner
        if runner is None:
            raise StateError(f"{self.name}: no runner attached (Profile.runner or attach)")
        sizes = runner.transform.check(tensors)
        with self.request(**sizes):
            return runner.run(tensors, sizes)

    # adoption (swap, then maintain on the swap thread)

    def adopt(self, version: int, payload: object) -> None:
        """Switch to the gears `payload` gives this profile (kept when it gives none)."""
        gears = self._gears_in(payload)
        with self._lock:
            old = self._state
            new = _State(version, gears or old.gears, self.dims, old.epoch + 1, self.id)
            self._state = new
            if old.active:
                self._draining.append(old)
            if self._runner is not None:
                self._runner.gears = dict(new.gears)
                self._releases += [
                    (new.epoch, d, g)
                    for d in self.dims
                    for g in set(old.gears[d]) - set(new.gears[d])
                ]

    def _gears_in(self, payload: object) -> dict[str, Gears] | None:
        gears = protocol.profile_gears(payload, self.name)
        if gears is None:
            return None
        try:
            if gears.keys() != self.dims.keys():
                raise ShapeError(f"dims {sorted(gears)}")
            for dim, values in gears.items():
                gears[dim] = normalize_gears(values)
                spec = self.dims[dim]
                if gears[dim][0] < spec.min or gears[dim][-1] > spec.max:
                    raise ShapeError(f"{dim} gears {list(values)} out of bounds")
        except ShapeError as e:
            log.error("profile %r: ignoring invalid snapshot gears (%s)", self.name, e)
            return None
        return gears

    @property
    def settled(self) -> bool:
        """The state in use is warmed up and every removal is released."""
        return self._runner is None or (self._warm is self._state and not self._releases)

    def maintain(self) -> None:
        """One warm-up and release step (the client's swap thread)."""
        runner, state = self._runner, self._state
        if runner is None:
            return
        if self._warm is not state:
            self._warm_up(runner, state)
        with self._lock:
            self._draining = [s for s in self._draining if s.active]
            oldest = min((s.epoch for s in self._draining), default=None)
            due = [r for r in self._releases if oldest is None or oldest >= r[0]]
            self._releases = [r for r in self._releases if r not in due]
            gears = self._state.gears
        for _, dim, gear in due:
            if gear not in gears[dim]:
                try:
                    runner.release(dim, gear)
                except Exception:
                    log.exception("profile %r: releasing %s=%d failed", self.name, dim, gear)

    def _warm_up(self, runner: Runner, state: _State) -> None:
        ready = set(runner.ready())
        missing = [v for v in itertools.product(*state.gears.values()) if v not in ready]
        try:
            runner.capture([dict(zip(self.dims, v, strict=True)) for v in missing[:WARM_BATCH]])
        except Exception:
            log.exception(
                "profile %r: capture failed; those gears run on larger ones or eager", self.name
            )
            missing = []
        if len(missing) <= WARM_BATCH:
            self._warm = state
