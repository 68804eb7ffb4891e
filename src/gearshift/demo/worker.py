"""A demo worker process: replays its share of the requests through a small torch model.

Commands come from the parent over a pipe, one reply each:
`("calibrate", dims, sizes)` -> seconds per padded token of the static path;
`("adaptive", namespace, dims, sizes)` -> a run through a gearshift client: the profile routes
and records every request, an AdaptiveRunner replays graphs of the gears in use, the client's
swap thread adopts new snapshots and captures their gears;
`("static", dims, sizes)` -> the same requests on an AdaptiveRunner that keeps the initial
power-of-two gears, with no client and no controller; `("exit",)`.
A run captures its initial gears first and is timed from then on; its reply is a dict
(`_replay`), an error `("error", traceback)`. Progress goes to the shared array `progress`:
[requests done, useful tokens, padded tokens] at `3 * index`.

SIGINT is ignored (inherited from the demo process, which handles Ctrl-C); SIGTERM exits
through the `finally` blocks, so the client releases its slot; a worker whose parent is gone
stops at its next request.
"""

from __future__ import annotations

import itertools
import math
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

import gearshift as gs
from gearshift.client.backends import CpuBackend
from gearshift.client.pool import GraphResourcePool
from gearshift.demo.workload import PROFILE, padded_tokens
from gearshift.dims import Dim, Gears, padded_work

WIDTH = 64  # features per token
CALIBRATION_REQUESTS = 48
MEMORY = (1 << 33, 1 << 34)  # the (free, total) reading the CPU "device" reports: 50 % used


class Model:
    """`x + W2 gelu(W1 x)` over the last axis: cost proportional to the tokens it is given.
    `tokens` counts every token computed, captures and replays alike."""

    def __init__(self, width: int = WIDTH, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.w1 = torch.randn(width, 4 * width, generator=g) / math.sqrt(width)
        self.w2 = torch.randn(4 * width, width, generator=g) / math.sqrt(4 * width)
        self.width, self.tokens = width, 0
        self._lock = threading.Lock()  # the swap thread captures while requests replay

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with self._lock:
            self.tokens += x.numel() // self.width
        return x + F.gelu(x @ self.w1) @ self.w2


def runner_for(model: Model, dims: Mapping[str, Dim]) -> gs.AdaptiveRunner:
    """An AdaptiveRunner of `model` with `x` = [*dims, width], in a pool of its own."""
    axes = (*dims, None)
    transform = gs.Transform(model, dims, {"x": axes}, outputs=axes)
    example = {"x": torch.zeros(*(1 for _ in dims), model.width)}
    return gs.AdaptiveRunner(transform, example, pool=GraphResourcePool(CpuBackend()))


def variants(gears: Mapping[str, Gears]) -> list[dict[str, int]]:
    return [dict(zip(gears, v, strict=True)) for v in itertools.product(*gears.values())]


def _inputs(model: Model, sizes: Mapping[str, np.ndarray]) -> Iterator[dict[str, torch.Tensor]]:
    """Request i's input: the leading `sizes[:, i]` block of one random tensor."""
    source = torch.randn(*(int(v.max()) for v in sizes.values()), model.width)
    for row in zip(*(v.tolist() for v in sizes.values()), strict=True):
        yield {"x": source[tuple(slice(0, n) for n in row)]}


# route(i, request) brackets request i's run and yields its padded work per dim
Route = Callable[[int, dict[str, int]], AbstractContextManager[Sequence[int]]]


def _replay(
    model: Model,
    runner: gs.AdaptiveRunner,
    route: Route,
    sizes: Mapping[str, np.ndarray],
    progress: Any,
    index: int,
) -> dict[str, Any]:
    """Capture the runner's gears, then run every request through `route`; the figures."""
    parent, names = os.getppid(), list(sizes)
    raw, padded = [0] * len(names), [0] * len(names)
    useful = cost = 0
    model.tokens = 0
    began, cpu = time.monotonic(), time.process_time()
    runner.capture(variants(runner.gears))
    rows = zip(*(v.tolist() for v in sizes.values()), strict=True)
    for i, (row, x) in enumerate(zip(rows, _inputs(model, sizes), strict=True)):
        if os.getppid() != parent:
            raise SystemExit("the demo process is gone")
        with route(i, dict(zip(names, row, strict=True))) as work:
            runner.run(x)
        raw = [a + b for a, b in zip(raw, row, strict=True)]
        padded = [a + b for a, b in zip(padded, work, strict=True)]
        useful, cost = useful + math.prod(row), cost + math.prod(work)
        progress[3 * index : 3 * index + 3] = [i + 1, useful, cost]
    return {
        "began": began,
        "ended": time.monotonic(),
        "cpu": time.process_time() - cpu,
        "requests": len(sizes[names[0]]),
        "useful": useful,
        "padded": cost,
        "computed": model.tokens,
        "dims": {d: [r, p] for d, r, p in zip(names, raw, padded, strict=True)},
        **runner.stats,
    }


def _static_route(runner: gs.AdaptiveRunner, sizes: Mapping[str, np.ndarray]) -> Route:
    dims = runner.transform.dims
    work = [padded_work(runner.gears[d], sizes[d], dim.splittable) for d, dim in dims.items()]
    per_request = np.stack(work, axis=1).tolist()
    return lambda i, _: nullcontext(per_request[i])


def calibrate(model: Model, dims: Mapping[str, Dim], sizes: Mapping[str, np.ndarray]) -> float:
    """Seconds per padded token of the static path (captures apart), on a spread of the
    requests."""
    n = len(next(iter(sizes.values())))
    rows = np.linspace(0, n - 1, min(n, CALIBRATION_REQUESTS)).astype(np.int64)
    sample = {d: v[rows] for d, v in sizes.items()}
    runner = runner_for(model, dims)
    runner.capture(variants(runner.gears))
    inputs = list(_inputs(model, sample))
    began = time.perf_counter()
    for x in inputs:
        runner.run(x)
    return (time.perf_counter() - began) / float(padded_tokens(dims, sample).sum())


def adaptive(
    model: Model,
    progress: Any,
    index: int,
    namespace: str,
    dims: Mapping[str, Dim],
    sizes: Mapping[str, np.ndarray],
) -> dict[str, Any]:
    """A run through a client of the controller serving `namespace`."""
    with gs.connect(namespace, memory=lambda: MEMORY) as client:
        profile = client.profile(PROFILE, dims)
        runner = profile.attach(runner_for(model, dims))

        @contextmanager
        def route(_: int, request: dict[str, int]) -> Iterator[list[int]]:
            with profile.request(**request) as plan:
                yield [sum(plan.chunks[d]) or n for d, n in request.items()]

        return _replay(model, runner, route, sizes, progress, index)


def static(
    model: Model,
    progress: Any,
    index: int,
    dims: Mapping[str, Dim],
    sizes: Mapping[str, np.ndarray],
) -> dict[str, Any]:
    """A run on the initial gears, kept: no client, no controller."""
    runner = runner_for(model, dims)
    return _replay(model, runner, _static_route(runner, sizes), sizes, progress, index)


def main(conn: Connection, progress: Any, index: int) -> None:
    """The worker's command loop (module docstring)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    torch.set_num_threads(1)  # N workers share the cores: one thread each
    model = Model()
    commands = {
        "calibrate": lambda *a: calibrate(model, *a),
        "adaptive": lambda *a: adaptive(model, progress, index, *a),
        "static": lambda *a: static(model, progress, index, *a),
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
