"""A profile's warm-up: which variants (one gear per dim) its runner captures, and when.

Each `step` (the client's swap thread, after the releases due) captures, largest first, at most
WARM_BATCH of

    product(gears in use) - ready - deferred - backing off

looking at WARM_WALK variants at most, so the swap thread stays responsive whatever the size
of the product. What is ready (or failed, raising) is the runner's; the warm-up keeps three
things:

- the walk (`_Walk`): the product of the gears in use, each dim's gears largest first (so a
  variant comes after every variant that covers it), where the walk is in it, which gears it
  defers, and whether a full device stopped it. A new state in use starts a new walk, which
  skips what is ready: only the combinations new gears add are captured. A device that holds
  all the graphs it may (`runner.room()`, GraphLimit) stops the walk, logged once with its
  reason; it counts as done (the other combinations run on larger graphs or eagerly) until a
  release makes room, which starts it anew.
- the start-up gears (`StartupGears`, deferred unless `lazy_start=False`): a start-up gear is
  one of its Dim's initial gears while every snapshot adopted since the start has kept it; a
  walk defers each variant that holds, on some dim, a start-up gear other than that dim's
  largest, so a fresh profile captures its largest variant at once (every request has a graph
  from the start, padded to it at worst). The runner remembers the variants its chunks found
  not ready (`take_wanted`); once the walk is done, each step captures a few of those wanted
  variants that the gears in use hold, neither ready nor backing off. A start-up gear a
  snapshot drops is an ordinary gear for good. Nothing is deferred for a runner without
  `take_wanted`.
- the backoff table (`_backoff`: variant -> attempts, due): a failed capture is logged once
  per reason (the traceback at debug level) and retried after RETRY_SECONDS (1 s, doubling, at
  most 60 s), RETRY_ATTEMPTS times, then not until a new state in use resets its attempts.

A variant's graph follows `lifecycle.GRAPH` (wanted, capturing, ready, failed, released),
held in `graphs` (a `lifecycle.Machines`: capturing, ready and failed stored, moved only by the
table's events, so that an event out of order raises StateError); `state` says where one is.
A graph the runner let go (a release after its grace, `released`, or a runner replaced) leaves
"ready" at the next step, or at its next capture.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from gearshift.core.dims import Dim, Gears, Variant
from gearshift.worker import lifecycle
from gearshift.worker.interfaces import NsClock, Runner
from gearshift.worker.lifecycle import GRAPH, READY, RELEASED, WANTED

log = logging.getLogger(__name__)
WARM_BATCH = 8  # variants captured per step: the swap thread stays responsive
WARM_WALK = 1024  # variants looked at per step at most (the ready ones are skipped)
RETRY_SECONDS = (1.0, 60.0)  # a failed capture is retried after 1 s, doubling, at most 60 s,
RETRY_ATTEMPTS = 4  # ... this many times; then only once the state in use changes
MAX_HELD = 4096  # wanted variants held for a capture (once full, no more kept)
Deferred = tuple[frozenset[int], ...]  # per dim (in dim order), the gears a walk defers


def largest_first(gears: Mapping[str, Gears]) -> Iterator[Variant]:
    """Every combination of `gears` (one per dim, in dim order), each dim's gears largest
    first: a variant comes after every variant that covers it (>= on every dim)."""
    return itertools.product(*(reversed(g) for g in gears.values()))


class StartupGears:
    """A profile's start-up gears per dim and the wanted variants waiting for a capture.
    `gears` is replaced whole on adoption and only shrinks, so a walk that reads it while a
    newer snapshot is adopted at worst captures a variant early."""

    def __init__(self, dims: Mapping[str, Dim], lazy: bool) -> None:
        self.gears = {d: frozenset(s.initial_gears if lazy else ()) for d, s in dims.items()}
        self.wanted: dict[Variant, None] = {}  # in the order requests wanted them

    def adopted(self, gears: Mapping[str, Gears]) -> None:
        """A snapshot of these gears in use was adopted: the start-up gears it lacks leave."""
        self.gears = {d: held.intersection(gears[d]) for d, held in self.gears.items()}

    def deferred(self, gears: Mapping[str, Gears], runner: object) -> Deferred:
        """Per dim of `gears` (the gears in use), the start-up gears but its largest; none
        when `runner` cannot tell what requests wanted (no `take_wanted`)."""
        start = self.gears if hasattr(runner, "take_wanted") else {}
        return tuple(start.get(d, frozenset()) - {g[-1]} for d, g in gears.items())

    def collect(self, runner: object) -> dict[Variant, None]:
        """Keep the variants `runner` saw wanted (`take_wanted`, when it has it) since the last
        call; returns every one kept, oldest first (the caller removes those it is done with)."""
        take = getattr(runner, "take_wanted", None)
        if take is not None:
            wanted = self.wanted
            for variant in take():
                if len(wanted) >= MAX_HELD:
                    break
                wanted[tuple(variant)] = None
        return self.wanted


def defers(variant: Variant, deferred: Deferred) -> bool:
    """Whether a walk that defers these gears leaves `variant` until a request wants it."""
    return any(g in held for g, held in zip(variant, deferred, strict=False))


@dataclass
class _Walk:
    """The walk of one state in use (`in_use`: compared by identity) and its `gears`."""

    in_use: object
    gears: Mapping[str, Gears]
    todo: Iterator[Variant]
    deferred: Deferred
    done: bool = False
    full: bool = False  # a full device stopped it


class WarmUp:
    """The warm-up of one profile (`name`, `dims` in record order); `clock` times the retries.
    `stats` counts capture failures, retries and the walks a full device stopped."""

    def __init__(self, name: str, dims: Mapping[str, Dim], lazy: bool, clock: NsClock) -> None:
        self.name, self.dims, self.clock = name, tuple(dims), clock
        self.startup = StartupGears(dims, lazy)
        self.stats = {"capture_failures": 0, "capture_retries": 0, "graph_limits": 0}
        self.graphs = lifecycle.Machines(GRAPH, (RELEASED, WANTED))
        self._walk: _Walk | None = None
        self._runner: Runner | None = None  # the runner of the last step
        self._backoff: dict[Variant, tuple[int, int]] = {}  # the failed: (attempts, due ns)
        self._failure = ""  # the reason of the last capture failure logged

    def settled(self, in_use: object) -> bool:
        """The walk of `in_use` is done and no wanted variant taken waits for a capture."""
        walk = self._walk
        return walk is not None and walk.in_use is in_use and walk.done and not self.startup.wanted

    def state(self, gears: Mapping[str, Gears], variant: Variant) -> str:
        """Where the graph of `variant` is in `lifecycle.GRAPH`, between steps (`gears`: the
        gears in use; a variant at rest is wanted while they hold it)."""
        return self.graphs.state(variant, WANTED if _holds(gears, variant) else RELEASED)

    def step(self, runner: Runner, in_use: object, gears: Mapping[str, Gears],
             released: int) -> None:
        """Capture the next few variants of `in_use` (its `gears`); `released`: how many graphs
        the releases due before this step freed (room again for a walk a full device stopped)."""
        if released or runner is not self._runner:
            self._let_go(runner)
        walk = self._walk
        if walk is None or walk.in_use is not in_use or (released and walk.full):
            walk = self._walk = self._start(runner, in_use, gears, walk)
        if not walk.done:
            self._walk_on(runner, walk)
        else:
            self._retry(runner, walk)
            self._capture_wanted(runner, walk)

    def _let_go(self, runner: Runner) -> None:
        """The ready graphs `runner` no longer holds are released."""
        self._runner, ready = runner, set(runner.ready())
        for variant in self.graphs.keys(READY):
            if variant not in ready:
                self.graphs.advance(variant, "release")

    def _start(self, runner: Runner, in_use: object, gears: Mapping[str, Gears],
               last: _Walk | None) -> _Walk:
        """A new walk, done at once if the `last` one went through the same gears and
        deferred the same; the failed variants the gears in use hold start their attempts
        over, the others leave the backoff table (their gear left)."""
        for variant in [v for v in self._backoff if not _holds(gears, v)]:
            self.graphs.advance(variant, "release")
            del self._backoff[variant]
        self._backoff = dict.fromkeys(self._backoff, (0, 0))
        walk = _Walk(in_use, gears, largest_first(gears), self.startup.deferred(gears, runner))
        walk.done = last is not None and last.done and not last.full and (
            last.gears == gears and last.deferred == walk.deferred)
        return walk

    def _walk_on(self, runner: Runner, walk: _Walk) -> None:
        ready, captured = set(runner.ready()), 0
        for looked, variant in enumerate(walk.todo, 1):
            if variant not in ready and variant not in self._backoff and not defers(
                variant, walk.deferred
            ):
                captured += self._capture(runner, walk, variant)
            if walk.full:
                break
            if captured >= WARM_BATCH or looked >= WARM_WALK:
                return
        walk.done = True

    def _retry(self, runner: Runner, walk: _Walk) -> None:
        """Capture again, a few at most, the failed variants whose backoff is over; each looked
        at goes to the end of the table, so the next step looks at the others first."""
        now, captured = self.clock.now_ns(), 0
        for variant, (attempts, due) in list(itertools.islice(self._backoff.items(), WARM_WALK)):
            if walk.full or captured >= WARM_BATCH:
                return
            del self._backoff[variant]
            self._backoff[variant] = (attempts, due)
            if due <= now and attempts < RETRY_ATTEMPTS:
                self.stats["capture_retries"] += 1
                captured += self._capture(runner, walk, variant)

    def _capture_wanted(self, runner: Runner, walk: _Walk) -> None:
        """Capture the variants requests wanted that the gears in use hold, neither ready nor
        backing off: a few at most; a full device drops them (they run on larger graphs)."""
        wanted = self.startup.collect(runner)
        ready, captured = set(runner.ready()) if wanted else set(), 0
        for looked, variant in enumerate(list(wanted), 1):
            if walk.full:
                wanted.clear()
                return
            del wanted[variant]
            fresh = variant not in ready and variant not in self._backoff
            if fresh and _holds(walk.gears, variant):
                captured += self._capture(runner, walk, variant)
            if captured >= WARM_BATCH or looked >= WARM_WALK:
                return

    def _capture(self, runner: Runner, walk: _Walk, variant: Variant) -> int:
        """Capture one variant; 1 if it was captured now. A failure goes to the backoff table;
        a full device stops the walk, logged once per walk with the reason of its cap."""
        room = getattr(runner, "room", None)  # a runner without it has no cap
        free, why = room() if room is not None else (None, "")
        if free is not None and free <= 0:
            walk.full = walk.done = True
            self.stats["graph_limits"] += 1
            log.warning(
                "profile %r: the device holds all the graphs it may (%s); %d combinations of"
                " gears %s are not all captured: the others run on larger graphs or eagerly",
                self.name, why, math.prod(map(len, walk.gears.values())), dict(walk.gears))
            return 0
        failed = self._backoff.get(variant)
        if self.graphs.state(variant) == READY:  # the runner let it go since the last step
            self.graphs.advance(variant, "release")
        self.graphs.advance(variant, "capture", WANTED)
        try:
            done = runner.capture([dict(zip(self.dims, variant, strict=True))])
        except Exception as e:
            self.graphs.advance(variant, "failed")
            self._failed(variant, 1 + (failed or (0, 0))[0], e)
            return 0
        self.graphs.advance(variant, "captured")
        self._backoff.pop(variant, None)
        return done

    def _failed(self, variant: Variant, attempts: int, e: Exception) -> None:
        self.stats["capture_failures"] += 1
        wait = min(RETRY_SECONDS[0] * 2 ** (attempts - 1), RETRY_SECONDS[1])
        self._backoff[variant] = (attempts, self.clock.now_ns() + int(wait * 1e9))
        reason = f"{type(e).__name__}: {e}"
        level = logging.WARNING if reason != self._failure else logging.DEBUG
        self._failure = reason
        log.log(level, "profile %r: capturing %s failed (attempt %d of %d): %s; it runs on"
                " larger graphs or eagerly meanwhile", self.name,
                dict(zip(self.dims, variant, strict=True)), attempts, RETRY_ATTEMPTS, reason,
                exc_info=log.isEnabledFor(logging.DEBUG))


def _holds(gears: Mapping[str, Gears], variant: Variant) -> bool:
    return len(variant) == len(gears) and all(
        g in held for held, g in zip(gears.values(), variant, strict=True))
