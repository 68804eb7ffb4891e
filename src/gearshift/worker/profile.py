"""A profile on a connected client: its request path (`Router`), requests bracketed in flight,
its runner, and the adoption of new snapshots with warm-up and release.

Adopting a snapshot (`Host.refresh`, on whichever thread sees the new version first; the
payload is decoded once for all profiles) builds a new `_InUse`, whose gears and lookup tables
never change after, and publishes it to request threads by one reference assignment under
`_lock`; an attached runner gets the new gears the same way. The client's swap thread then
calls `maintain()`: it warms the runner up (captures the variants of the gears in use, a few
per call; until one is ready the runner routes its chunks to the next larger ready variant, or
eagerly) and releases the graphs of removed gears once every request bracketed by
`request()`/`run()` that started on older gears in use has finished (the grace period).

Invariants: a request counts itself in its `_InUse`'s `active` under `_lock`, where the swap
also happens, so once gears in use are replaced no request can join them; a removal made by the
adoption of epoch `e` is released only when no gears in use older than `e` have a request in
flight, and only if the gear is not back in the gears in use. A profile knows its client only
as a `Host` (docs/architecture.md, "Worker side").
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from gearshift import protocol
from gearshift.core.dims import Dim, Gears, normalize_gears
from gearshift.errors import ShapeError, StateError
from gearshift.worker.interfaces import Host, Runner
from gearshift.worker.routing import Route, Router, _InUse

log = logging.getLogger(__name__)
WARM_BATCH = 8  # variants captured per maintain() call: the swap thread stays responsive


class _Request:
    """`Profile.request`'s context (a class: a generator's costs twice as much per request).
    Enter counts the request in the gears in use under the profile's lock, then routes it;
    leaving (also when routing raised) uncounts it and wakes the swap thread if that drained
    replaced gears."""

    __slots__ = ("in_use", "profile", "sizes")

    def __init__(self, profile: Profile, sizes: Mapping[str, int]) -> None:
        self.profile, self.sizes = profile, sizes

    def __enter__(self) -> Route:
        profile = self.profile
        host = profile._host
        if host.region.version() != host.seen:
            host.refresh()
        with profile._lock:
            self.in_use = in_use = profile._in_use
            in_use.active += 1
        try:
            return profile._route(in_use, self.sizes)
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        profile, in_use = self.profile, self.in_use
        with profile._lock:
            in_use.active -= 1
            drained = not in_use.active and in_use is not profile._in_use
        if drained:
            profile._host.wake()


class Profile(Router):
    """One named graph-compiled function of a client's device; made by `Client.profile`."""

    def __init__(self, host: Host, pid: int, name: str, dims: Mapping[str, Dim]) -> None:
        self.registered = False
        self.rejected: Exception | None = None  # a registration the controller refused
        self._lock = threading.Lock()
        self._draining: list[_InUse] = []  # replaced gears in use with requests in flight
        self._releases: list[tuple[int, str, int]] = []  # (epoch that removed it, dim, gear)
        self._runner: Runner | None = None
        self._warm: _InUse | None = None  # the gears in use whose variants are all captured
        super().__init__(host, pid, name, dims)  # the request path, last: it generates `route`

    def request(self, **sizes: int) -> _Request:
        """`route`, and count the request in flight until the block ends: graphs of gears a
        newer snapshot removes are kept until it is done. Bracket every graph run with it."""
        return _Request(self, sizes)

    # graph runs

    def attach(self, runner: Runner) -> Runner:
        """Drive `runner` from this profile: it runs on the gears in use, the swap thread warms
        it up and releases removed gears after their grace period. Returns it."""
        if list(runner.gears) != list(self.dims):
            raise ShapeError(
                f"{self.name}: the runner's dims {list(runner.gears)} are not "
                f"{list(self.dims)} (in this order)"
            )
        with self._lock:
            self._runner = runner
            runner.gears = dict(self._in_use.gears)
        self._host.attached(runner)
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
            old = self._in_use
            new = _InUse(version, gears or old.gears, self.dims, old.epoch + 1, self.id)
            self._in_use = new
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
        """The gears in use are warmed up and every removal is released."""
        return self._runner is None or (self._warm is self._in_use and not self._releases)

    def maintain(self) -> None:
        """One warm-up and release step (the client's swap thread)."""
        runner, in_use = self._runner, self._in_use
        if runner is None:
            return
        if self._warm is not in_use:
            self._warm_up(runner, in_use)
        with self._lock:
            self._draining = [u for u in self._draining if u.active]
            oldest = min((u.epoch for u in self._draining), default=None)
            due = [r for r in self._releases if oldest is None or oldest >= r[0]]
            self._releases = [r for r in self._releases if r not in due]
            gears = self._in_use.gears
        for _, dim, gear in due:
            if gear not in gears[dim]:
                try:
                    runner.release(dim, gear)
                except Exception:
                    log.exception("profile %r: releasing %s=%d failed", self.name, dim, gear)

    def _warm_up(self, runner: Runner, in_use: _InUse) -> None:
        ready = set(runner.ready())
        missing = [v for v in itertools.product(*in_use.gears.values()) if v not in ready]
        try:
            runner.capture([dict(zip(self.dims, v, strict=True)) for v in missing[:WARM_BATCH]])
        except Exception:
            log.exception(
                "profile %r: capture failed; those gears run on larger ones or eager", self.name
            )
            missing = []
        if len(missing) <= WARM_BATCH:
            self._warm = in_use
