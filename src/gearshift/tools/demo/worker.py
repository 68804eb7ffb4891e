"""A demo worker process: replays trace rows through a transformer block, on the CPU.

Commands come from the parent over a pipe, one reply each:
`("calibrate", dims)` -> captures the initial gears on the runner kept for the static run and
times replays of each sequence gear: `[(tokens, pairs, CPU seconds), ...]`;
`("static", dims, sizes)` -> requests on that runner, its gears kept, with no client and no
controller;
`("adaptive", namespace, dims, sizes, times)` -> requests through a gearshift client on the
run's `TraceClock` (`times`: the rows' compressed trace times): the profile routes and records
every request, an AdaptiveRunner replays graphs of the gears in use, the client's swap thread
adopts new snapshots and captures their gears;
`("exit",)`.
A run captures its initial gears, replies `("prepared", None)` and starts on the parent's
`("go",)`; then each worker takes the next row of `sizes` from the shared counter `queue` until
none is left. Its reply is a dict (`_replay`), an error `("error", traceback)`. Progress goes to
the shared array `progress`: [requests done, useful tokens, padded tokens] at `3 * index`. In
the adaptive run a worker adopts a new snapshot, and waits until its swap thread has captured
the new gears, before its next request; the captures count in the run (why: docs/tools.md).

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
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import gearshift as gs
from gearshift.clock import Clock
from gearshift.core.dims import Dim, Gears, padded_work
from gearshift.graphs.backends import CpuBackend
from gearshift.graphs.pool import GraphResourcePool
from gearshift.tools.demo.clock import TraceClock
from gearshift.tools.demo.workload import HEADS, PROFILE, SEQ, WIDTH

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


@dataclass(frozen=True)
class Feed:
    """A run's link to the demo process: `take()` the next row (shared by all workers, in
    trace order; past the end when none is left), `start()` once the initial gears are
    captured, `report(requests, useful, padded)` the progress so far."""

    take: Callable[[], int]
    start: Callable[[], None] = lambda: None
    report: Callable[[int, int, int], None] = lambda *_: None


def _replay(
    model: Model, runner: Runner, route: Route, sizes: Mapping[str, np.ndarray], feed: Feed
) -> dict[str, Any]:
    """Capture the runner's gears, `feed.start()`, then run the rows `feed.take()` gives
    through `route`; the figures of the run (from the start on)."""
    dims, names = runner.transform.dims, list(sizes)
    rows = list(zip(*(v.tolist() for v in sizes.values()), strict=True))
    inputs = _inputs(model, dims, rows)
    runner.capture(variants(runner.gears))
    feed.start()
    parent, stats = os.getppid(), dict(runner.stats)
    raw, padded = [0] * len(names), [0] * len(names)
    done = useful = cost = useful_pairs = padded_pairs = 0
    model.tokens, runner.capture_seconds, runner.capture_tokens = 0, 0.0, 0
    began, cpu = time.monotonic(), time.process_time()
    while (i := feed.take()) < len(rows):
        if os.getppid() != parent:
            raise SystemExit("the demo process is gone")
        row = rows[i]
        with route(i, dict(zip(names, row, strict=True))) as work:
            runner.run(inputs[i])
        raw = [a + b for a, b in zip(raw, row, strict=True)]
        padded = [a + b for a, b in zip(padded, work, strict=True)]
        useful, cost = useful + math.prod(row), cost + math.prod(work)
        useful_pairs += pairs(dims, row)
        padded_pairs += pairs(dims, work)
        done += 1
        feed.report(done, useful, cost)
    return {
        "began": began,
        "ended": time.monotonic(),
        "cpu": time.process_time() - cpu,
        "capture_cpu": runner.capture_seconds,
        "capture_tokens": runner.capture_tokens,
        "requests": done,
        "useful": useful,
        "padded": cost,
        "useful_pairs": useful_pairs,
        "padded_pairs": padded_pairs,
        "computed": model.tokens,
        "dims": {d: [r, p] for d, r, p in zip(names, raw, padded, strict=True)},
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


def adaptive(
    model: Model,
    namespace: str,
    dims: Mapping[str, Dim],
    sizes: Mapping[str, np.ndarray],
    feed: Feed,
    clock: Clock | None = None,
) -> dict[str, Any]:
    """A run through a client (on `clock`) of the controller serving `namespace`."""
    with gs.connect(namespace, clock=clock, memory=lambda: MEMORY) as client:
        profile = client.profile(PROFILE, dims)
        runner = profile.attach(runner_for(model, dims))

        def route(_: int, request: dict[str, int]) -> _Routed:
            client.refresh()  # a new snapshot's gears are captured before the request
            while not profile.settled:  # (module docstring)
                time.sleep(SETTLE_POLL)
            return _Routed(profile.request(**request), request)

        return _replay(model, runner, route, sizes, feed)


def static(
    model: Model, runner: Runner, sizes: Mapping[str, np.ndarray], feed: Feed
) -> dict[str, Any]:
    """A run on the runner's initial gears, kept: no client, no controller."""
    return _replay(model, runner, _static_route(runner, sizes), sizes, feed)


def main(conn: Connection, index: int, progress: Any, queue: Any, origin: Any) -> None:
    """The worker's command loop (module docstring); `queue` and `origin` are the run's shared
    `Value`s (`TraceClock`)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    torch.set_num_threads(1)  # N workers share the cores: one thread each
    model = Model()
    kept: dict[tuple[str, ...], Runner] = {}  # the static run's runner, by dims

    def static_runner(dims: Mapping[str, Dim]) -> Runner:
        if tuple(dims) not in kept:
            kept[tuple(dims)] = runner_for(model, dims)
        return kept[tuple(dims)]

    def take() -> int:
        with queue.get_lock():
            queue.value += 1
            return queue.value - 1

    def start() -> None:
        conn.send(("prepared", None))
        try:
            go = conn.recv()
        except EOFError:
            raise SystemExit("the demo process is gone") from None
        assert go == ("go",), go

    def report(*figures: int) -> None:
        progress[3 * index : 3 * index + 3] = figures

    feed = Feed(take, start, report)
    commands = {
        "calibrate": lambda dims: calibrate(model, static_runner(dims)),
        "static": lambda dims, sizes: static(model, static_runner(dims), sizes, feed),
        "adaptive": lambda namespace, dims, sizes, times: adaptive(
            model, namespace, dims, sizes, feed, TraceClock(times, origin, queue)
        ),
    }
    conn.send(("ready", os.getpid()))
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
