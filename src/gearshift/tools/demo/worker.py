"""A demo worker process: replays trace rows through a transformer block, on the CPU.

Commands come from the parent over a pipe, one reply each:
`("model", name)`, first if at all -> the model is `model_for(name)` (default: `block`); the
reply describes it;
`("calibrate", dims)` -> captures the initial gears on the runner kept for the static arm and
times replays of each sequence gear: `[(tokens, pairs, CPU seconds), ...]`;
`("prepare", namespace, dims, priced, sizes, times)` -> the two arms over the same rows: the
static one on that runner, its gears kept, with no client and no controller; the adaptive one
through a gearshift client on the `TraceClock` (`times`: the rows' compressed trace times): the
profile (dims `priced`) routes and records every request, an AdaptiveRunner replays graphs of
the gears in use, the client's swap thread adopts new snapshots and captures their gears. Each
arm captures its initial gears; the reply is `None`;
`("slice", arm, end)` -> the arm ("static" or "adaptive") takes the next row from its shared
counter `queues[arm]` until row `end`; the reply is the slice's figures (`Arm.replay`);
`("settle",)` -> the adaptive arm adopts the newest snapshot and waits until its gears are
captured, so that no capture runs in a static slice; the reply is its wall and CPU seconds;
`("finish",)` -> the adaptive client closes; `("exit",)`.
An error replies `("error", traceback)`. Progress goes to the shared array `progress`:
[requests done, useful tokens, padded tokens] of the arm, cumulative, at `3 * (index + arm *
workers)`. An adaptive request waits until the swap thread has captured the gears of a new
snapshot (why: docs/tools.md).

SIGINT is ignored (inherited from the demo process, which handles Ctrl-C); SIGTERM exits
through the `finally` blocks, so the client releases its slot; a worker whose parent is gone
stops at its next request.
"""

from __future__ import annotations

import itertools
import math
import os
import resource
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import gearshift as gs
from gearshift.core.dims import Dim, Gears, padded_work
from gearshift.graphs.backends import CpuBackend
from gearshift.graphs.pool import GraphResourcePool
from gearshift.tools.demo.clock import TraceClock
from gearshift.tools.demo.workload import HEADS, MODEL, PROFILE, SEQ, WIDTH

SETTLE_POLL = 0.001  # seconds between looks at whether the swap thread has captured new gears
MEMORY = (1 << 33, 1 << 34)  # the (free, total) reading the CPU "device" reports: 50 % used
CALIBRATION_TOKENS = 8192  # a gear is timed over this many tokens' worth of replays, ...
CALIBRATION_REPEATS = (3, 16)  # ... within these bounds: the median skips a preempted one


class Model:
    """One pre-norm transformer block over `x = [..., S, width]`, as prefill runs it:
    `x += Wo attention(LN x)`, causal, `heads` heads (`F.scaled_dot_product_attention`, its
    CPU flash kernel), then `x += W2 gelu(W1 LN x)`. Causal attention makes padding after a
    sequence's last token harmless: no token sees a later one, so the real tokens' outputs
    do not depend on it (a padded row of a batch is a sequence of its own).
    `tokens` counts every token computed, captures and replays alike."""

    def __init__(self, width: int = WIDTH, heads: int = HEADS, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)

        def weight(rows: int, cols: int) -> torch.Tensor:
            return torch.randn(rows, cols, generator=g) / math.sqrt(rows)

        self.qkv, self.out = weight(width, 3 * width), weight(width, width)
        self.w1, self.w2 = weight(width, 4 * width), weight(4 * width, width)
        self.width, self.heads, self.tokens = width, heads, 0
        self._lock = threading.Lock()  # the swap thread captures while requests replay

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with self._lock:
            self.tokens += x.numel() // self.width
        h = x.reshape(-1, *x.shape[-2:])  # [N, S, H]: 4-d heads take the flash kernel
        n, s, width = h.shape
        qkv = F.layer_norm(h, (width,)) @ self.qkv
        q, k, v = qkv.view(n, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + a.transpose(1, 2).reshape(n, s, width) @ self.out
        h = h + F.gelu(F.layer_norm(h, (width,)) @ self.w1) @ self.w2
        return h.view(x.shape)


class Runner(gs.AdaptiveRunner):
    """An AdaptiveRunner that adds up the CPU seconds and the tokens of its captures (they
    and releases run on one thread at a time: the caller's, then the swap thread)."""

    capture_seconds = 0.0
    capture_tokens = 0

    def capture(self, variants: Iterable[Mapping[str, int]]) -> int:
        began, ready = time.thread_time(), set(self.ready())
        try:
            return super().capture(variants)
        finally:
            self.capture_seconds += time.thread_time() - began
            self.capture_tokens += sum(map(math.prod, set(self.ready()) - ready))


def features(model: Model, dims: Mapping[str, Dim]) -> tuple[int, ...]:
    """x's static trailing sizes: the features, after a sequence axis of 1 without SEQLEN."""
    return (model.width,) if SEQ in dims else (1, model.width)


def runner_for(model: Model, dims: Mapping[str, Dim]) -> Runner:
    """A Runner of `model` with `x` = [*dims, *features], in a pool of its own."""
    tail = features(model, dims)
    axes = (*dims, *(None for _ in tail))
    transform = gs.Transform(model, dims, {"x": axes}, outputs=axes)
    example = {"x": torch.zeros(*(1 for _ in dims), *tail)}
    return Runner(transform, example, pool=GraphResourcePool(CpuBackend()))


def variants(gears: Mapping[str, Gears]) -> list[dict[str, int]]:
    return [dict(zip(gears, v, strict=True)) for v in itertools.product(*gears.values())]


def pairs(dims: Mapping[str, Dim], sizes: Sequence[int]) -> int:
    """Tokens times sequence length (the last size with SEQLEN, else 1)."""
    return math.prod(sizes) * (sizes[-1] if SEQ in dims else 1)


def _inputs(
    model: Model, dims: Mapping[str, Dim], rows: Sequence[Sequence[int]]
) -> list[dict[str, torch.Tensor]]:
    """Each row's input: the leading `row` block of one random tensor."""
    source = torch.randn(*np.max(rows, axis=0).tolist(), *features(model, dims))
    return [{"x": source[tuple(slice(0, n) for n in row)]} for row in rows]


# route(i, request) brackets request i's run, entered as its padded work per dim
Route = Callable[[int, dict[str, int]], AbstractContextManager[Sequence[int]]]


ARMS = ("static", "adaptive")  # their index in the progress array and the row counters


class Arm:
    """One arm of the comparison in a worker: its runner and `route` over the rows of `sizes`,
    replayed a slice at a time (`replay`), on its own model (its tokens counted apart);
    `report(requests, useful, padded)` gets its progress so far."""

    def __init__(self, model: Model, runner: Runner, route: Route,
                 sizes: Mapping[str, np.ndarray],
                 report: Callable[[int, int, int], None] = lambda *_: None) -> None:
        self.model, self.runner, self.route, self.report = model, runner, route, report
        self.names = list(sizes)
        self.rows = list(zip(*(v.tolist() for v in sizes.values()), strict=True))
        self.inputs = _inputs(model, runner.transform.dims, self.rows)
        self.done = self.useful = self.padded = 0
        runner.capture(variants(runner.gears))

    def replay(self, take: Callable[[int], int], end: int) -> dict[str, Any]:
        """Run the rows `take(end)` gives (the next one, `end` when none is left before it)
        through `route`; the slice's figures."""
        dims, model, runner = self.runner.transform.dims, self.model, self.runner
        parent, stats = os.getppid(), dict(runner.stats)
        raw, padded = [0] * len(self.names), [0] * len(self.names)
        done = useful = cost = useful_pairs = padded_pairs = 0
        model.tokens, runner.capture_seconds, runner.capture_tokens = 0, 0.0, 0
        began, cpu, thread = time.monotonic(), time.process_time(), time.thread_time()
        while (i := take(end)) < end:
            if os.getppid() != parent:
                raise SystemExit("the demo process is gone")
            row = self.rows[i]
            with self.route(i, dict(zip(self.names, row, strict=True))) as work:
                runner.run(self.inputs[i])
            raw = [a + b for a, b in zip(raw, row, strict=True)]
            padded = [a + b for a, b in zip(padded, work, strict=True)]
            useful, cost = useful + math.prod(row), cost + math.prod(work)
            useful_pairs += pairs(dims, row)
            padded_pairs += pairs(dims, work)
            done += 1
            self.report(self.done + done, self.useful + useful, self.padded + cost)
        self.done, self.useful, self.padded = self.done + done, self.useful + useful, \
            self.padded + cost
        return {
            "began": began,
            "ended": time.monotonic(),
            "cpu": time.process_time() - cpu,
            "thread_cpu": time.thread_time() - thread,
            "capture_cpu": runner.capture_seconds,
            "capture_tokens": runner.capture_tokens,
            "requests": done,
            "useful": useful,
            "padded": cost,
            "useful_pairs": useful_pairs,
            "padded_pairs": padded_pairs,
            "computed": model.tokens,
            "dims": {d: [r, p] for d, r, p in zip(self.names, raw, padded, strict=True)},
            "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            **{k: v - stats[k] for k, v in runner.stats.items()},
        }


class _Routed:
    """The adaptive run's bracket of one request (`Profile.request`), entered as its padded
    work per dim: its chunks' gears summed, the raw size when eager."""

    __slots__ = ("request", "sizes")

    def __init__(self, request: AbstractContextManager[gs.Route], sizes: dict[str, int]) -> None:
        self.request, self.sizes = request, sizes

    def __enter__(self) -> list[int]:
        plan = self.request.__enter__()
        return [sum(plan.chunks[d]) or n for d, n in self.sizes.items()]

    def __exit__(self, *exc: Any) -> None:
        self.request.__exit__(*exc)


def _static_route(runner: Runner, sizes: Mapping[str, np.ndarray]) -> Route:
    dims = runner.transform.dims
    work = [padded_work(runner.gears[d], sizes[d], dim.splittable) for d, dim in dims.items()]
    per_request = np.stack(work, axis=1).tolist()
    return lambda i, _: nullcontext(per_request[i])


def calibrate(model: Model, runner: Runner) -> list[tuple[int, int, float]]:
    """Capture the runner's gears and time replays of each gear of its last dim (the others
    at their smallest): `(tokens, pairs, median CPU seconds of a replay)`."""
    dims = runner.transform.dims
    runner.capture(variants(runner.gears))
    *lead, last = runner.gears.values()
    rows = [(*(g[0] for g in lead), g) for g in last]
    samples = []
    for row, x in zip(rows, _inputs(model, dims, rows), strict=True):
        tokens = math.prod(row)
        seconds = []
        low, high = CALIBRATION_REPEATS
        for _ in range(min(high, max(low, CALIBRATION_TOKENS // tokens))):
            began = time.thread_time()
            runner.run(x)
            seconds.append(time.thread_time() - began)
        samples.append((tokens, pairs(dims, row), float(np.median(seconds))))
    return samples


def static_arm(model: Model, runner: Runner, sizes: Mapping[str, np.ndarray],
               report: Callable[[int, int, int], None] = lambda *_: None) -> Arm:
    """The arm on the runner's initial gears, kept: no client, no controller."""
    return Arm(model, runner, _static_route(runner, sizes), sizes, report)


class AdaptiveArm(Arm):
    """The arm through `client` (connected to the controller serving its namespace): its
    profile `dims` and a runner of its own model."""

    def __init__(self, client: gs.Client, dims: Mapping[str, Dim],
                 sizes: Mapping[str, np.ndarray],
                 report: Callable[[int, int, int], None] = lambda *_: None,
                 make: Callable[[], Model] = Model) -> None:
        model = make()
        self.client, self.profile = client, client.profile(PROFILE, dims)
        runner = self.profile.attach(runner_for(model, dims))

        def route(_: int, request: dict[str, int]) -> _Routed:
            self.settle()  # a new snapshot's gears are captured before the request
            return _Routed(self.profile.request(**request), request)

        super().__init__(model, runner, route, sizes, report)

    def settle(self) -> None:
        """Adopt the newest snapshot and wait until its gears are captured (module docstring)."""
        self.client.refresh()
        while not self.profile.settled:
            time.sleep(SETTLE_POLL)


def model_for(name: str) -> tuple[Callable[[], Model], dict[str, Any]]:
    """The demo's model by name, and its description: `block` (Model) or `llama`
    (`llama.DemoLlama`, which needs the demo extra)."""
    if name == "llama":
        from gearshift.tools.demo import llama

        shape = llama.LlamaShape()
        about = {"width": shape.hidden, "heads": shape.heads, "about": llama.about(shape)}
        return llama.DemoLlama, about  # type: ignore[return-value]  (Model's interface)
    return Model, {"width": WIDTH, "heads": HEADS, "about": MODEL}


def _settle(arm: AdaptiveArm) -> dict[str, float]:
    began, cpu = time.monotonic(), time.process_time()
    arm.settle()
    return {"seconds": time.monotonic() - began, "cpu": time.process_time() - cpu}


def main(conn: Connection, index: int, progress: Any, queues: Sequence[Any],
         origin: Any) -> None:
    """The worker's command loop (module docstring); `queues` are the arms' row counters and
    `origin` the adaptive arm's start (shared `Value`s: `TraceClock`)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    torch.set_num_threads(1)  # N workers share the cores: one thread each
    model, make = Model(), Model
    kept: dict[tuple[str, ...], Runner] = {}  # the static arm's runner, by dims
    arms: dict[str, Arm] = {}
    stack = ExitStack()
    workers = len(progress) // (3 * len(ARMS))

    def static_runner(dims: Mapping[str, Dim]) -> Runner:
        if tuple(dims) not in kept:
            kept[tuple(dims)] = runner_for(model, dims)
        return kept[tuple(dims)]

    def reporter(arm: str) -> Callable[[int, int, int], None]:
        at = 3 * (index + ARMS.index(arm) * workers)

        def report(*figures: int) -> None:
            progress[at : at + 3] = figures

        return report

    def prepare(namespace: str, dims: Mapping[str, Dim], priced: Mapping[str, Dim],
                sizes: Mapping[str, np.ndarray], times: np.ndarray) -> None:
        arms["static"] = static_arm(model, static_runner(dims), sizes, reporter("static"))
        clock = TraceClock(times, origin, queues[ARMS.index("adaptive")])
        client = stack.enter_context(gs.connect(namespace, clock=clock, memory=lambda: MEMORY))
        arms["adaptive"] = AdaptiveArm(client, priced, sizes, reporter("adaptive"), make)

    def choose(name: str) -> dict[str, Any]:  # ("model", name): before any other command
        nonlocal model, make
        make, about = model_for(name)
        model = make()
        kept.clear()
        return about

    def replay(arm: str, end: int) -> dict[str, Any]:
        queue = queues[ARMS.index(arm)]

        def take(end: int) -> int:
            with queue.get_lock():
                if queue.value >= end:
                    return end
                queue.value += 1
                return queue.value - 1

        return arms[arm].replay(take, end)

    commands = {
        "calibrate": lambda dims: calibrate(model, static_runner(dims)),
        "prepare": prepare,
        "model": choose,
        "slice": replay,
        "settle": lambda: _settle(arms["adaptive"]),  # type: ignore[arg-type]
        "finish": stack.close,
    }
    conn.send(("ready", os.getpid()))
    with stack:
        while True:
            try:
                command, *args = conn.recv()
            except EOFError:  # the parent is gone
                return
            if command == "exit":
                return
            try:
                conn.send((command, commands[command](*args)))
            except Exception:
                conn.send(("error", traceback.format_exc()))
