"""A profile on a connected client: its request path (`Router`), requests bracketed in flight,
its runner, and the adoption of new snapshots with warm-up and release.

Adopting a snapshot (`Host._refresh`, on whichever thread sees the new version first; the
payload is decoded once for all profiles) builds a new `_InUse`, whose gears and routing table
never change after, outside the profile's lock, and publishes it to request threads by one
reference assignment under `_lock`; an attached runner gets the new gears the same way. The
client's swap thread then calls `_maintain()`: it releases the graphs of removed gears once
every request bracketed by `request()`/`run()` that started on older gears in use has finished
(the grace period), then takes one warm-up step (`worker.warmup`: a few captures, largest
first; until a variant is ready the runner routes its chunks to the next larger ready one, or
eagerly), then reports what the runner measured of each graph it captured, and its static
buffers' bytes, to the controller, once the profile is registered (`worker.measured`).

Invariants: a request counts itself in its `_InUse`'s `active` under `_lock`, where the swap
also happens, so once gears in use are replaced no request can join them; a removal made by the
adoption of epoch `e` is released only when no gears in use older than `e` have a request in
flight, and only if the gear is not back in the gears in use. A profile knows its client only
as a `Host` (docs/architecture.md, "Worker side").
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from gearshift import protocol
from gearshift.core.dims import Dim, Gears, normalize_gears
from gearshift.core.group import Group
from gearshift.errors import ShapeError, StateError
from gearshift.worker.interfaces import Host, Runner
from gearshift.worker.measured import Measured
from gearshift.worker.routing import Route, Router, _InUse
from gearshift.worker.warmup import WarmUp

log = logging.getLogger(__name__)


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
        self.in_use = in_use = profile._enter()
        try:
            return profile._route(in_use, self.sizes)
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        self.profile._leave(self.in_use)


class Profile(Router):
    """One named graph-compiled function of a client's device; made by `Client.profile`.
    `lazy_start` (default on): capture the start-up gears a request needs when it first does,
    not at once (`worker.warmup`); off, every combination of the gears in use is captured.
    `group`: the rank of a group it is (docs/architecture.md, "Tensor parallel")."""

    def __init__(self, host: Host, pid: int, name: str, dims: Mapping[str, Dim], *,
                 lazy_start: bool = True, group: Group | None = None) -> None:
        self.group = group  # the rank of a group it declares (None: none)
        self.registered = False
        self.rejected: Exception | None = None  # a registration the controller refused
        self._lock = threading.Lock()
        self._draining: list[_InUse] = []  # replaced gears in use with requests in flight
        self._releases: list[tuple[int, str, int]] = []  # (epoch that removed it, dim, gear)
        self._runner: Runner | None = None
        super().__init__(host, pid, name, dims)  # the request path: dims, gears in use
        for dim, spec in self.dims.items():
            if spec.reordered is not None:
                log.warning("profile %r: %s gears %s were sorted and de-duplicated to %s",
                            name, dim, spec.reordered, list(spec.initial_gears))
        self._measured = Measured(self.dims)  # graphs measured, on their way to the controller
        self._warmup = WarmUp(name, self.dims, lazy_start, host.clock)
        self.stats = self._warmup.stats  # capture failures, retries, graph limits met

    def request(self, **sizes: int) -> _Request:
        """`route`, and count the request in flight until the block ends: graphs of gears a
        newer snapshot removes are kept until it is done. Bracket every graph run with it."""
        return _Request(self, sizes)

    def _enter(self) -> _InUse:
        """Adopt a new snapshot if there is one, then count a request in the gears in use."""
        host = self._host
        if host.region.version() != host._seen:
            host._refresh()
        lock = self._lock
        lock.acquire()  # cheaper than `with` on the request path
        in_use = self._in_use
        in_use.active += 1
        lock.release()
        return in_use

    def _leave(self, in_use: _InUse) -> None:
        """Uncount a request; wake the swap thread if it drained replaced gears."""
        lock = self._lock
        lock.acquire()
        in_use.active -= 1
        drained = not in_use.active and in_use is not self._in_use
        lock.release()
        if drained:
            self._host._wake()

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
            runner.gears = self._in_use.gears  # the same object: gears live in one place
        if hasattr(runner, "on_want"):  # a variant a request wants wakes the swap thread
            runner.on_want = self._host._wake
        self._host._attached(runner)
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
        `options` go to `Transform` (symbols, outputs, lengths, handles_padding). Refuses with
        PaddingError a `fn` whose results would change with the padding (`graphs.padding`),
        with ShapeError an input `fn` does not take. Imports torch."""
        from gearshift.graphs.adaptive import AdaptiveRunner
        from gearshift.graphs.transform import Transform

        return self.attach(AdaptiveRunner(Transform(fn, self.dims, inputs, **options), example))

    def compile(
        self,
        fn: Callable[..., Any],
        inputs: Mapping[str, tuple[str | None, ...]],
        example: Mapping[str, Any],
        *,
        mode: str | None = None,
        options: Mapping[str, Any] | None = None,
        backend: Any = "inductor",
        lock_dir: str | None = None,
        **transform_options: Any,
    ) -> Runner:
        """`runner()` for a compiled model: a `CompiledRunner` (each gear combination its own
        static-shape `torch.compile(fn, dynamic=False, mode=, options=, backend=)`, compiled by
        the swap thread; `lock_dir`: its per-shape locks), with the bindings, example,
        options and refusals of `runner()`; attached. Imports torch."""
        from gearshift.graphs.torchcompile import CompiledRunner
        from gearshift.graphs.transform import Transform

        transform = Transform(fn, self.dims, inputs, **transform_options)
        return self.attach(CompiledRunner(transform, example, mode=mode, options=options,
                                          compile_backend=backend, lock_dir=lock_dir))

    def run(self, /, **tensors: Any) -> Any:
        """`fn(**tensors)` through the attached runner, bracketed (as `request`: `_enter` and
        `_leave`, inlined), routed and recorded once: the runner replays the Route found here,
        on the gears in use."""
        runner = self._runner
        if runner is None:
            raise StateError(f"{self.name}: no runner attached (Profile.runner or attach)")
        sizes = runner.transform.check(tensors)
        host, lock = self._host, self._lock  # `_enter`, inlined (the step's calls are few)
        if host.region.version() != host._seen:
            host._refresh()
        lock.acquire()
        in_use = self._in_use
        in_use.active += 1
        lock.release()
        try:
            return runner.run(tensors, sizes, self._route(in_use, sizes))
        finally:
            lock = self._lock  # `_leave`, inlined
            lock.acquire()
            in_use.active -= 1
            drained = not in_use.active and in_use is not self._in_use
            lock.release()
            if drained:
                host._wake()

    # adoption (swap, then _maintain on the swap thread)

    def _adopt(self, version: int, payload: object) -> None:
        """Switch to the gears `payload` gives this profile (kept when it gives none). The new
        state is built outside the lock `request()` takes; only the swap is under it."""
        gears = self._gears_in(payload)
        while True:  # adoptions are serialised by the host: one pass, unless one raced this
            old = self._in_use
            new = _InUse(version, gears or old.gears, self.dims, old.epoch + 1, self.id)
            removed = [
                (new.epoch, d, g) for d in self.dims for g in set(old.gears[d]) - set(new.gears[d])
            ]
            self._warmup.startup.adopted(new.gears)  # idempotent: a raced pass may apply it again
            with self._lock:
                if self._in_use is not old:
                    continue
                self._in_use = new
                if old.active:
                    self._draining.append(old)
                if self._runner is not None:
                    self._runner.gears = new.gears
                    self._releases += removed
                return

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
        """The gears in use are warmed up, every removal is released and every wanted variant
        taken from the runner is captured (or failed: it retries)."""
        return self._runner is None or (
            not self._releases and self._warmup.settled(self._in_use)
        )

    def _forked(self, write: Callable[..., bool]) -> None:
        """In a forked child: record through `write` (the child's, never the parent's ring),
        with a fresh lock (a parent's thread may have held this one at the fork)."""
        self._lock = threading.Lock()
        self._rebind(write)

    def _maintain(self) -> None:
        """One release and warm-up step (the client's swap thread): removed gears whose grace
        is over go first, so their memory and room are back before new gears are captured."""
        runner, in_use = self._runner, self._in_use
        if runner is None:
            return
        released = self._release_due(runner)
        self._warmup.step(runner, in_use, in_use.gears, released)
        self._report(runner, in_use)

    def _report(self, runner: Runner, in_use: _InUse) -> None:
        """Send what the runner measured to the controller (once registered); never raises."""
        try:
            self._measured.collect(runner)
            now = self._now_ns()
            if self.registered and self._measured.due(now):
                self._measured.flush(self._write, now, self.id, in_use.version)
        except Exception:
            self._measured.failures += 1
            if self._measured.failures == 1:  # once: the swap thread ticks often
                log.exception("profile %r: reporting measurements failed", self.name)

    def _release_due(self, runner: Runner) -> int:
        """Release the removals whose grace is over; returns how many graphs went."""
        with self._lock:
            self._draining = [u for u in self._draining if u.active]
            oldest = min((u.epoch for u in self._draining), default=None)
            due = [r for r in self._releases if oldest is None or oldest >= r[0]]
            self._releases = [r for r in self._releases if r not in due]
            gears = self._in_use.gears
        released = 0
        collecting = getattr(getattr(runner, "backend", None), "collecting", None)
        with collecting() if collecting is not None else contextlib.nullcontext():  # 1 collect
            for _, dim, gear in due:
                if gear not in gears[dim]:
                    try:
                        released += runner.release(dim, gear)
                    except Exception:
                        log.exception("profile %r: releasing %s=%d failed", self.name, dim, gear)
        return released
