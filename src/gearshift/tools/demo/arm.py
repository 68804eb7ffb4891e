"""One arm of the comparison in a demo worker: a lane per profile, replaying merged rows (torch).

A `Lane` is one profile of one arm: the profile's model (in a worker both arms run one model
per profile, so that they differ in their gears and request path only), a `Runner` of it and
its `route`, over the profile's rows, on inputs drawn from the profile's seed (the same in
both arms). `Lane.figures()` gives what the lane did since the last call (requests, tokens,
pairs, raw and padded sizes per dim, the wall and CPU time of its requests, its captures, its
runner's counts; a compiled runner's compiles before the arm started, `startup`, in the first
report only) and starts anew, so captures made between slices (`AdaptiveArm.settle`) count
in the next report. An `Arm` replays the merged rows (`mix.Mix`) a slice at a time: row j on
lane `which[j]`, that lane's row `local[j]`. The static arm (`static_arm`) keeps the runners'
initial gears, with no client; the adaptive arm (`AdaptiveArm`) runs every request through
its profile on a client of the controller (`Profile.run`: routed, recorded, replayed), and
waits before it until the gears of a new snapshot are captured (why: docs/tools.md), a wait
its lanes' request times leave out.
"""

from __future__ import annotations

import itertools
import math
import os
import resource
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

import numpy as np
import torch

from gearshift import worker as gw
from gearshift.core.dims import Dim, Gears, padded_work
from gearshift.graphs import AdaptiveRunner, Transform
from gearshift.graphs.backends import CpuBackend
from gearshift.graphs.pool import GraphResourcePool
from gearshift.tools.demo import block
from gearshift.tools.demo.figures import COMPILE_KEYS
from gearshift.tools.demo.workload import SEQ

SETTLE_POLL = 0.001  # seconds between looks at whether the swap thread has captured new gears
MAX_KEPT = 65536  # padded work kept per adaptive lane, by snapshot version and raw sizes


class Model(Protocol):
    """A demo model (`block.Model`, `llama.DemoLlama`): `x = [..., width]` in and out of the
    same leading shape as its runner binds it; `tokens` counts every token it computed."""

    width: int
    tokens: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor: ...


class Counted:
    """`model`, counting the tokens computed through it: on each thread apart (`here`) and
    in all (`tokens`), whoever else calls the model; and each thread's CPU seconds inside the
    model (`model_cpu`)."""

    def __init__(self, model: Model) -> None:
        self.model, self._local = model, threading.local()
        self.tokens, self._lock = 0, threading.Lock()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.numel() // self.model.width
        self._local.tokens = self.here() + tokens
        with self._lock:
            self.tokens += tokens
        return timed(self._local, self.model, x)

    def here(self) -> int:
        """Tokens computed on this thread so far."""
        return getattr(self._local, "tokens", 0)

    def model_cpu(self) -> float:
        """This thread's CPU seconds inside the model so far."""
        return getattr(self._local, "cpu", 0.0)


def timed(local: threading.local, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, the calling thread's CPU seconds in it added to `local.cpu`."""
    began = time.thread_time()
    try:
        return fn(*args)
    finally:
        local.cpu = getattr(local, "cpu", 0.0) + time.thread_time() - began


class Runner(AdaptiveRunner):
    """An AdaptiveRunner of a `Counted` model that adds up the CPU seconds and the tokens of
    its captures, their runs to time the new graphs included (captures and releases run on
    one thread at a time: the caller's, then the swap thread; requests may run meanwhile):
    its thread's tokens (`here`) and CPU seconds (`cpu`), which `compiled` counts its way;
    `computed()`: every token run through this runner (the model may be another's too)."""

    capture_seconds = 0.0
    capture_tokens = 0

    def capture(self, variants: Iterable[Mapping[str, int]]) -> int:
        began, tokens = self.cpu(), self.here()
        try:
            return super().capture(variants)
        finally:
            self.capture_seconds += self.cpu() - began
            self.capture_tokens += self.here() - tokens

    def here(self) -> int:
        """Tokens computed on this thread so far."""
        return self.transform.fn.here()

    def computed(self) -> int:
        """Tokens computed through this runner so far, on every thread."""
        return self.transform.fn.tokens

    def model_cpu(self) -> float:
        """This thread's CPU seconds inside the model so far (its graphs' runs of it)."""
        return self.transform.fn.model_cpu()

    def cpu(self) -> float:
        """The CPU seconds that time a capture: this thread's."""
        return time.thread_time()


def process_cpu() -> float:
    """This process's CPU seconds and its children's it waited for (a compile's C++ compiler)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def features(model: Model, dims: Mapping[str, Dim]) -> tuple[int, ...]:
    """x's static trailing sizes: the features, after a sequence axis of 1 without SEQLEN."""
    return (model.width,) if SEQ in dims else (1, model.width)


def runner_for(model: Model, dims: Mapping[str, Dim]) -> Runner:
    """A Runner of `model` with `x` = [*dims, *features], in a pool of its own."""
    transform, example = binding(Counted(model), model, dims)
    return Runner(transform, example, pool=GraphResourcePool(CpuBackend()))


def binding(fn: Callable[..., Any], model: Model,
            dims: Mapping[str, Dim]) -> tuple[Transform, dict[str, torch.Tensor]]:
    """`fn` bound as a runner of `model` binds it, `x` = [*dims, *features]; its example."""
    tail = features(model, dims)
    axes = (*dims, *(None for _ in tail))
    example = {"x": torch.zeros(*(1 for _ in dims), *tail)}
    return Transform(fn, dims, {"x": axes}, outputs=axes), example


def variants(gears: Mapping[str, Gears]) -> list[dict[str, int]]:
    return [dict(zip(gears, v, strict=True)) for v in itertools.product(*gears.values())]


def pairs(dims: Mapping[str, Dim], sizes: Sequence[int]) -> int:
    """Tokens times sequence length (the last size with SEQLEN, else 1)."""
    return math.prod(sizes) * (sizes[-1] if SEQ in dims else 1)


def inputs(model: Model, dims: Mapping[str, Dim], rows: Sequence[Sequence[int]],
           seed: int | None = None) -> list[dict[str, torch.Tensor]]:
    """Each row's input: the leading `row` block of one random tensor (drawn from `seed`,
    else from torch's global generator)."""
    g = None if seed is None else torch.Generator().manual_seed(seed)
    source = torch.randn(*np.max(rows, axis=0).tolist(), *features(model, dims), generator=g)
    return [{"x": source[tuple(slice(0, n) for n in row)]} for row in rows]


# route(i, request) brackets the run of the lane's row i, entered as its padded work per dim
# and the route its runner replays (None: the runner routes; the static arm's and the
# adaptive arm's, whose profile routes)
Route = Callable[[int, dict[str, int]],
                 AbstractContextManager[tuple[Sequence[int], gw.Route | None]]]


class Lane:
    """One profile of an arm over the rows of `sizes` (module docstring), its inputs drawn
    from `seed` (the same in both arms); it captures the runner's gears first."""

    def __init__(self, model: Model, runner: Runner, route: Route,
                 sizes: Mapping[str, np.ndarray], seed: int | None = None) -> None:
        self.model, self.runner, self.route = model, runner, route
        self.names = list(sizes)
        self.rows = list(zip(*(v.tolist() for v in sizes.values()), strict=True))
        self.inputs = inputs(model, runner.transform.dims, self.rows, seed)
        self.output: Any = None  # the last request's
        runner.capture(variants(runner.gears))
        self._base = self._counters()
        # a compiled runner's compiles before the arm starts (calibration's, the initial gears')
        self._startup: dict[str, Any] | None = (
            {k: v for k, v in self._base.items() if k in COMPILE_KEYS}
            if "compiles" in self._base else None)
        self._clear()

    def call(self, tensors: dict[str, torch.Tensor], route: Any) -> Any:
        """Run one request on the runner along `route` (what the lane's `route` entered as)."""
        return self.runner.run(tensors, None, route)

    def _counters(self) -> dict[str, Any]:
        r = self.runner
        return {"computed": r.computed(), "capture_cpu": r.capture_seconds,
                "capture_tokens": r.capture_tokens, **r.stats}

    def _clear(self) -> None:
        self.raw, self.work = [0] * len(self.names), [0] * len(self.names)
        self.requests = self.useful = self.padded = self.useful_pairs = self.padded_pairs = 0
        self.busy = self.busy_cpu = self.model_cpu = 0.0

    def run(self, i: int) -> tuple[int, int]:
        """Route and run row i; its useful and padded tokens."""
        row, dims = self.rows[i], self.runner.transform.dims
        model = self.runner.model_cpu()
        began, cpu = time.monotonic(), time.thread_time()
        with self.route(i, dict(zip(self.names, row, strict=True))) as (work, route):
            self.output = self.call(self.inputs[i], route)
        self.busy += time.monotonic() - began
        self.busy_cpu += time.thread_time() - cpu
        self.model_cpu += self.runner.model_cpu() - model
        self.raw = [a + b for a, b in zip(self.raw, row, strict=True)]
        self.work = [a + b for a, b in zip(self.work, work, strict=True)]
        useful, padded = math.prod(row), math.prod(work)
        self.requests += 1
        self.useful += useful
        self.padded += padded
        self.useful_pairs += pairs(dims, row)
        self.padded_pairs += pairs(dims, work)
        return useful, padded

    def figures(self) -> dict[str, Any]:
        """What the lane did since the last call: its requests and their wall and CPU seconds
        (`busy_seconds`, `busy_cpu`; `model_cpu`: of that CPU, the model's own), tokens
        computed, captures and the runner's counts."""
        now = self._counters()
        out = {
            "requests": self.requests,
            "useful": self.useful,
            "padded": self.padded,
            "useful_pairs": self.useful_pairs,
            "padded_pairs": self.padded_pairs,
            "busy_seconds": self.busy,
            "busy_cpu": self.busy_cpu,
            "model_cpu": self.model_cpu,
            "dims": {d: [r, p] for d, r, p in zip(self.names, self.raw, self.work, strict=True)},
            **{k: v - self._base[k] for k, v in now.items()},
        }
        if self._startup is not None:  # in the first report only
            out["startup"], self._startup = self._startup, dict.fromkeys(self._startup, 0)
        self._base = now
        self._clear()
        return out


class Arm:
    """Lanes over the merged rows (module docstring); `report(requests, useful, padded)` gets
    the arm's progress so far, every profile's together."""

    def __init__(self, lanes: Mapping[str, Lane], which: np.ndarray, local: np.ndarray,
                 report: Callable[[int, int, int], None] = lambda *_: None) -> None:
        self.lanes, self.report = dict(lanes), report
        order = list(self.lanes.values())
        self.order = [(order[p], i) for p, i in zip(which.tolist(), local.tolist(), strict=True)]
        self.done = self.useful = self.padded = 0

    def ready(self) -> None:
        """Before each request (the static arm: nothing)."""

    def figures(self) -> dict[str, dict[str, Any]]:
        return {name: lane.figures() for name, lane in self.lanes.items()}

    def replay(self, take: Callable[[int], int], end: int) -> dict[str, Any]:
        """Run the merged rows `take(end)` gives (the next one, `end` when none is left before
        it); the slice's figures: its times and each lane's (`profiles`)."""
        parent = os.getppid()
        began, cpu, thread = time.monotonic(), process_cpu(), time.thread_time()
        while (j := self.next(take, end)) < end:
            if os.getppid() != parent:
                raise SystemExit("the demo process is gone")
            self.ready()
            lane, i = self.order[j]
            useful, padded = self.run(lane, i, j)
            self.done, self.useful, self.padded = (self.done + 1, self.useful + useful,
                                                   self.padded + padded)
            self.report(self.done, self.useful, self.padded)
        return {
            "began": began,
            "ended": time.monotonic(),
            "cpu": process_cpu() - cpu,
            "thread_cpu": time.thread_time() - thread,
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "profiles": self.figures(),
        }

    def next(self, take: Callable[[int], int], end: int) -> int:
        """The next merged row to run, `end` when the slice is done (here: `take(end)`)."""
        return take(end)

    def run(self, lane: Lane, i: int, j: int) -> tuple[int, int]:
        """Run `lane`'s row i (merged row j); its useful and padded tokens."""
        return lane.run(i)


class AdaptiveLane(Lane):
    """A lane whose requests run through its profile's `Profile.run` (routed, recorded and
    replayed in one call, as a serving loop's step); `route` gives the padded work."""

    profile: gw.Profile

    def call(self, tensors: dict[str, torch.Tensor], route: Any) -> Any:
        return self.profile.run(**tensors)


def _static_route(runner: Runner, sizes: Mapping[str, np.ndarray]) -> Route:
    dims = runner.transform.dims
    work = [padded_work(runner.gears[d], sizes[d], dim.splittable) for d, dim in dims.items()]
    per_request = np.stack(work, axis=1).tolist()
    return lambda i, _: nullcontext((per_request[i], None))


def static_arm(lanes: Mapping[str, tuple[Model, Runner, Mapping[str, np.ndarray]]],
               which: np.ndarray, local: np.ndarray,
               report: Callable[[int, int, int], None] = lambda *_: None,
               arm: Callable[..., Arm] = Arm) -> Arm:
    """The arm (an `arm(lanes, which, local, report)`) on each runner's initial gears, kept
    (`lanes`: profile -> model, runner, its rows' sizes): no client, no controller. The k-th
    profile's inputs are drawn from seed k, as the adaptive arm's."""
    made = {p: Lane(model, runner, _static_route(runner, sizes), sizes, seed=k)
            for k, (p, (model, runner, sizes)) in enumerate(lanes.items())}
    return arm(made, which, local, report)


class AdaptiveArm(Arm):
    """The arm through `client` (connected to the controller serving its namespace): per
    profile (`profiles`: name -> its dims and its rows' sizes) a profile of the client and a
    runner (`runner`) of the profile's model (`model(name)`: in a worker, the static arm's
    model of that profile, so that the arms differ in their gears and request path only)."""

    def __init__(self, client: gw.Client,
                 profiles: Mapping[str, tuple[Mapping[str, Dim], Mapping[str, np.ndarray]]],
                 which: np.ndarray, local: np.ndarray,
                 report: Callable[[int, int, int], None] = lambda *_: None,
                 model: Callable[[str], Model] = lambda _: block.Model(),
                 runner: Callable[[Model, Mapping[str, Dim]], Runner] = runner_for) -> None:
        self.client, self.profiles = client, {}
        self._settled = -1  # the snapshot version the last `settle` adopted (-1: none yet)
        lanes = {}
        for k, (name, (dims, sizes)) in enumerate(profiles.items()):
            m = model(name)
            # Start-up gears captured at once, as the static arm's: the arms differ in gears only
            self.profiles[name] = profile = client.profile(name, dims, lazy_start=False)
            attached = profile.attach(runner(m, dims))
            lanes[name] = lane = AdaptiveLane(m, attached, _worked(profile), sizes, seed=k)
            lane.profile = profile
        super().__init__(lanes, which, local, report)

    def ready(self) -> None:
        """A new snapshot's gears are captured before the request: one read of the version
        when none was published since the last `settle`."""
        if self.client.region.version() != self._settled:
            self.settle()

    def settle(self) -> None:
        """Adopt the newest snapshot and wait until every profile's gears are captured."""
        self._settled = self.client.region.version()
        self.client._refresh()
        while not all(p.settled for p in self.profiles.values()):
            time.sleep(SETTLE_POLL)


def _worked(profile: gw.Profile) -> Route:
    """A request's padded work per dim on the profile's gears in use (captured before it:
    `AdaptiveArm.ready`), counted as the static arm counts its own (`padded_work`), kept per
    snapshot version and raw sizes."""
    kept: dict[tuple[int, ...], tuple[list[int], None]] = {}
    dims = profile.dims

    def route(_: int, request: dict[str, int]) -> AbstractContextManager[Any]:
        key = (profile.version, *request.values())
        found = kept.get(key)
        if found is None:
            if len(kept) >= MAX_KEPT:
                kept.clear()
            gears = profile.gears
            found = kept[key] = ([int(padded_work(gears[d], np.array(n), dims[d].splittable))
                                  for d, n in request.items()], None)
        return nullcontext(found)

    return route
