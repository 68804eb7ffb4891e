"""A profile on a connected client: its request path (`Router`), requests bracketed in flight,
its runner, and the adoption of new snapshots with warm-up and release.

Adopting a snapshot (`Host.refresh`, on whichever thread sees the new version first; the
payload is decoded once for all profiles) builds a new `_InUse`, whose gears and lookup tables
never change after, outside the profile's lock, and publishes it to request threads by one
reference assignment under `_lock`; an attached runner gets the new gears the same way. The
client's swap thread then calls `maintain()`: it warms the runner up and releases the graphs
of removed gears once every request bracketed by `request()`/`run()` that started on older
gears in use has finished (the grace period).

Warm-up is incremental: `_base` holds gears whose every combination has been captured (or
tried), and the plan of new gears in use is the lazy sequence of combinations with a gear
outside it (`beyond`), a few captures and a bounded walk per call; until a variant is ready the
runner routes its chunks to the next larger ready one, or eagerly. A failed capture is retried
later (backing off, a few times), logged once per reason (the traceback at debug level); a
device that holds all the graphs it may (GraphLimit) stops the plan, logged once with its
reason, and the state counts as warmed (its other combinations run on larger graphs or
eagerly). Start-up gears are captured lazily (`worker.startup`; off
with `lazy_start=False`): a plan defers each variant that holds a start-up gear other than its
dim's largest, and once the plan is done each call captures, a few at a time, the variants
requests wanted (`take_wanted`) that the gears in use hold, neither ready nor failed (those
retry). What the runner measured of each graph it captured goes to the controller from the
same thread, once the profile is registered (`worker.measured`).

Invariants: a request counts itself in its `_InUse`'s `active` under `_lock`, where the swap
also happens, so once gears in use are replaced no request can join them; a removal made by the
adoption of epoch `e` is released only when no gears in use older than `e` have a request in
flight, and only if the gear is not back in the gears in use. A profile knows its client only
as a `Host` (docs/architecture.md, "Worker side").
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from gearshift import protocol
from gearshift.core.dims import Dim, Gears, Variant, normalize_gears
from gearshift.errors import ShapeError, StateError
from gearshift.worker.interfaces import Host, Runner
from gearshift.worker.measured import Measured
from gearshift.worker.routing import Route, Router, _InUse
from gearshift.worker.startup import Deferred, StartupGears, defers, undeferred

log = logging.getLogger(__name__)
WARM_BATCH = 8  # variants captured per maintain() call: the swap thread stays responsive
WARM_WALK = 1024  # planned variants looked at per call at most (the ready ones are skipped)
RETRY_SECONDS = (1.0, 60.0)  # a failed capture is retried after 1 s, doubling, at most 60 s,
RETRY_ATTEMPTS = 4  # ... this many times; then only once the gears in use change


def beyond(base: Mapping[str, Gears], gears: Mapping[str, Gears]) -> Iterator[Variant]:
    """Lazily, each once, every combination of `gears` (one gear per dim, in `gears`' dim
    order) with at least one gear not in `base`: for each dim d in order, its gears outside
    `base` with, before d, the gears in `base` and, after d, all gears; larger gears first."""
    names = list(gears)
    old = {d: set(base.get(d, ())) for d in names}
    for i, dim in enumerate(names):
        new = [g for g in reversed(gears[dim]) if g not in old[dim]]
        if new:
            before = [[g for g in reversed(gears[d]) if g in old[d]] for d in names[:i]]
            after = [list(reversed(gears[d])) for d in names[i + 1 :]]
            yield from itertools.product(*before, new, *after)


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
    """One named graph-compiled function of a client's device; made by `Client.profile`.
    `lazy_start` (default on): capture the start-up gears a request needs when it first does,
    not at once (`worker.startup`); off, every combination of the gears in use is captured."""

    def __init__(self, host: Host, pid: int, name: str, dims: Mapping[str, Dim], *,
                 lazy_start: bool = True) -> None:
        self.registered = False
        self.rejected: Exception | None = None  # a registration the controller refused
        self._lock = threading.Lock()
        self._draining: list[_InUse] = []  # replaced gears in use with requests in flight
        self._releases: list[tuple[int, str, int]] = []  # (epoch that removed it, dim, gear)
        self._runner: Runner | None = None
        self._warm: _InUse | None = None  # the gears in use whose plan is done
        self._plan: tuple[_InUse, Iterator[Variant], Deferred] | None = None  # under way
        self._base: dict[str, Gears] = {}  # every combination of these was captured or tried,
        self._deferred: Deferred = ()  # ... or holds one of these per dim (`worker.startup`)
        self._retry: dict[Variant, tuple[int, int]] = {}  # failed: (attempts, due ns)
        self._limited: _InUse | None = None  # the gears in use a GraphLimit stopped
        self.stats = {"capture_failures": 0, "capture_retries": 0, "graph_limits": 0}
        self._failure = ""  # the reason of the last capture failure logged
        super().__init__(host, pid, name, dims)  # the request path, last: it generates `route`
        for dim, spec in self.dims.items():
            if spec.reordered is not None:
                log.warning("profile %r: %s gears %s were sorted and de-duplicated to %s",
                            name, dim, spec.reordered, list(spec.initial_gears))
        self.measured = Measured(self.dims)  # graphs measured, on their way to the controller
        self._startup = StartupGears(self.dims, lazy_start)

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
        from gearshift.graphs.compiled import CompiledRunner
        from gearshift.graphs.transform import Transform

        transform = Transform(fn, self.dims, inputs, **transform_options)
        return self.attach(CompiledRunner(transform, example, mode=mode, options=options,
                                          compile_backend=backend, lock_dir=lock_dir))

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
        """Switch to the gears `payload` gives this profile (kept when it gives none). The new
        state is built outside the lock `request()` takes; only the swap is under it."""
        gears = self._gears_in(payload)
        while True:  # adoptions are serialised by the host: one pass, unless one raced this
            old = self._in_use
            new = _InUse(version, gears or old.gears, self.dims, old.epoch + 1, self.id)
            removed = [
                (new.epoch, d, g) for d in self.dims for g in set(old.gears[d]) - set(new.gears[d])
            ]
            self._startup.adopted(new.gears)  # idempotent: a raced pass may apply it again
            with self._lock:
                if self._in_use is not old:
                    continue
                self._in_use = new
                if old.active:
                    self._draining.append(old)
                if self._runner is not None:
                    self._runner.gears = dict(new.gears)
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
            self._warm is self._in_use and not self._releases and not self._startup.wanted
        )

    def forked(self, write: Callable[..., bool]) -> None:
        """In a forked child: record through `write` (the child's, never the parent's ring),
        with a fresh lock (a parent's thread may have held this one at the fork)."""
        self._lock = threading.Lock()
        self.rebind(write)

    def maintain(self) -> None:
        """One release and warm-up step (the client's swap thread): removed gears whose grace
        is over go first, so their memory and room are back before new gears are captured."""
        runner, in_use = self._runner, self._in_use
        if runner is None:
            return
        if self._release_due(runner) and self._limited is in_use:
            self._limited = self._warm = None  # room again: plan what the cap stopped
        if self._warm is not in_use:
            self._warm_up(runner, in_use)
        else:
            if self._retry:
                self._retry_failed(runner, in_use)
            self._capture_wanted(runner, in_use)
        self._report(runner, in_use)

    def _report(self, runner: Runner, in_use: _InUse) -> None:
        """Send what the runner measured to the controller (once registered); never raises."""
        try:
            self.measured.collect(runner)
            if self.registered and self.measured.pending:
                self.measured.flush(self._write, self._now_ns(), self.id, in_use.version)
        except Exception:
            self.measured.failures += 1
            if self.measured.failures == 1:  # once: the swap thread ticks 20 times a second
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
        for _, dim, gear in due:
            if gear not in gears[dim]:
                try:
                    released += runner.release(dim, gear)
                except Exception:
                    log.exception("profile %r: releasing %s=%d failed", self.name, dim, gear)
        if due:
            self._base = {d: tuple(g for g in b if g in gears[d]) for d, b in self._base.items()}
        return released

    def _warm_up(self, runner: Runner, in_use: _InUse) -> None:
        """The next captures of the plan of `in_use` (made on its first call): at most
        WARM_BATCH captured, WARM_WALK looked at; deferred variants are walked, not captured.
        The gears an earlier plan deferred and this one does not leave the base: replanned."""
        if self._plan is None or self._plan[0] is not in_use:
            deferred = self._startup.deferred(in_use.gears, runner)
            left = dict(zip(self.dims, undeferred(self._deferred, deferred), strict=False))
            base = {d: tuple(g for g in self._base.get(d, ())
                             if g in in_use.gears[d] and g not in left.get(d, ()))
                    for d in self.dims}
            self._plan = (in_use, beyond(base, in_use.gears), deferred)
            self._retry = {v: (0, 0) for v in self._retry if self._holds(in_use, v)}
        _, plan, deferred = self._plan
        captured = 0
        for walked, variant in enumerate(plan, 1):
            if not defers(variant, deferred):
                captured += self._capture(runner, in_use, variant)
            if self._limited is in_use:
                break
            if captured >= WARM_BATCH or walked >= WARM_WALK:
                return
        self._warm, self._plan = in_use, None
        if self._limited is not in_use:
            self._base, self._deferred = dict(in_use.gears), deferred

    def _capture_wanted(self, runner: Runner, in_use: _InUse) -> None:
        """Capture the variants requests wanted that `in_use` holds, neither ready nor failed
        (those retry): at most WARM_BATCH captured, WARM_WALK looked at; a full device drops
        them (they run on larger graphs or eagerly)."""
        wanted = self._startup.collect(runner)
        ready, captured = set(runner.ready()) if wanted else set(), 0
        for walked, variant in enumerate(list(wanted), 1):
            if self._limited is in_use:  # a full device: they run on larger graphs or eagerly
                wanted.clear()
                return
            del wanted[variant]
            if variant not in ready and variant not in self._retry and self._holds(in_use, variant):
                captured += self._capture(runner, in_use, variant)
            if captured >= WARM_BATCH or walked >= WARM_WALK:
                return

    def _retry_failed(self, runner: Runner, in_use: _InUse) -> None:
        now = self._host.clock.now_ns()
        for variant, (attempts, due) in list(self._retry.items()):
            if due <= now and attempts < RETRY_ATTEMPTS and self._limited is not in_use:
                self.stats["capture_retries"] += 1
                self._capture(runner, in_use, variant)

    def _capture(self, runner: Runner, in_use: _InUse, variant: Variant) -> int:
        """Capture one variant; 1 if it was captured now. A failure is logged and scheduled
        for a retry; a full device (`runner.room()`) stops the plan, logged once per gears in
        use with the reason of its cap."""
        room = getattr(runner, "room", None)  # a runner without it has no cap
        free, why = room() if room is not None else (None, "")
        if free is not None and free <= 0:
            if self._limited is not in_use:
                self._limited = in_use
                self.stats["graph_limits"] += 1
                log.warning(
                    "profile %r: the device holds all the graphs it may (%s); %d combinations"
                    " of gears %s are not all captured: the others run on larger graphs or"
                    " eagerly", self.name, why, math.prod(map(len, in_use.gears.values())),
                    dict(in_use.gears),
                )
            return 0
        try:
            done = runner.capture([dict(zip(self.dims, variant, strict=True))])
        except Exception as e:
            self.stats["capture_failures"] += 1
            attempts = self._retry.get(variant, (0, 0))[0] + 1
            wait = min(RETRY_SECONDS[0] * 2 ** (attempts - 1), RETRY_SECONDS[1])
            self._retry[variant] = (attempts, self._host.clock.now_ns() + int(wait * 1e9))
            reason = f"{type(e).__name__}: {e}"
            level = logging.WARNING if reason != self._failure else logging.DEBUG
            self._failure = reason
            log.log(
                level, "profile %r: capturing %s failed (attempt %d of %d): %s; it runs on"
                " larger graphs or eagerly meanwhile", self.name,
                dict(zip(self.dims, variant, strict=True)), attempts, RETRY_ATTEMPTS, reason,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
            return 0
        self._retry.pop(variant, None)
        return done

    def _holds(self, in_use: _InUse, variant: Variant) -> bool:
        return len(variant) == len(self.dims) and all(
            g in in_use.gears[d] for d, g in zip(self.dims, variant, strict=True))
