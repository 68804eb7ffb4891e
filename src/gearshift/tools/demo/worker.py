"""A demo worker process: replays the merged rows of every profile through a model, on the CPU.

Commands come from the parent over a pipe, one reply each:
`("model", name, compile=None)`, first if at all -> the model is `model_for(name)` (default:
`block`), its runners `compiled.CompiledRunner`s when `compile` is given (Dynamo backend,
namespace, cache directory: `compiled.prepare_cache`), else eager ones; the reply describes it;
`("calibrate", dims)` (profile -> its dims) -> per profile, a model and a runner kept for the
static arm, its initial gears captured, and timed replays of each gear of its last dim:
`{profile: [(tokens, pairs, CPU seconds), ...]}`;
`("prepare", namespace, profiles, which, local, times)` (`profiles`: name -> its dims, its dims
priced, its rows' sizes; `which`, `local`: the merged rows, `mix.Mix`) -> the two arms over the
same rows (`arm`): the static one on those runners, their gears kept, with no client and no
controller; the adaptive one through a gearshift client on the `TraceClock` (`times`: the
merged rows' compressed trace times): each profile (dims priced) routes and records every
request, an AdaptiveRunner per profile, of the static arm's model of that profile (the arms
share each model: they differ in gears and request path only), replays graphs of the gears in
use, the client's swap thread adopts new snapshots and captures their gears. Each arm
captures its initial gears; the reply is `None`;
`("slice", arm, end)` -> the arm ("static" or "adaptive") takes the next merged row from its
shared counter `queues[arm]` until row `end`; the reply is the slice's figures (`Arm.replay`);
`("settle",)` -> the adaptive arm adopts the newest snapshot and waits until its gears are
captured, so that no capture runs in a static slice; the reply is its wall and CPU seconds and
each lane's figures since the slice (its captures);
`("finish",)` -> the adaptive client closes; `("exit",)`.
An error replies `("error", traceback)`. Progress goes to the shared array `progress`:
[requests done, useful tokens, padded tokens] of the arm, every profile's, cumulative, at
`3 * (index + arm * workers)`.

Tensor parallel (`tp` ranks > 1, the Llama only): this worker is one rank of an instance; the
"model" command joins the instance's gloo group and makes every model this rank's shard
(`tp.ShardedLlama`; the driver, rank 0, keeps the unsharded model to check outputs), and the
arms are `lockstep`'s: the driver takes the rows and broadcasts them, the adaptive arm's
profiles are grouped (the group `demo-instance-I`, a device per rank: the worker's index) and
its runners driven by `GroupRank`s; only the driver reports progress. Every rank gets every
command; the ranks' collectives follow from running the same commands in the same order.

SIGINT is ignored (inherited from the demo process, which handles Ctrl-C); SIGTERM exits
through the `finally` blocks, so the client releases its slot; a worker whose parent is gone
stops at its next request.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from functools import partial
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import torch

import gearshift as gs
from gearshift.core.dims import Dim
from gearshift.tools.demo import block
from gearshift.tools.demo.arm import (
    AdaptiveArm,
    Arm,
    Model,
    Runner,
    inputs,
    pairs,
    process_cpu,
    runner_for,
    static_arm,
    variants,
)
from gearshift.tools.demo.clock import TraceClock
from gearshift.tools.demo.workload import HEADS, MODEL, WIDTH

MEMORY = (1 << 33, 1 << 34)  # the (free, total) reading the CPU "device" reports: 50 % used
CALIBRATION_TOKENS = 8192  # a gear is timed over this many tokens' worth of replays, ...
CALIBRATION_REPEATS = (3, 16)  # ... within these bounds: the median skips a preempted one
ARMS = ("static", "adaptive")  # their index in the progress array and the row counters


def calibrate(model: Model, runner: Runner) -> list[tuple[int, int, float]]:
    """Capture the runner's gears and time replays of each gear of its last dim (the others
    at their smallest): `(tokens, pairs, median CPU seconds of a replay)`."""
    dims = runner.transform.dims
    runner.capture(variants(runner.gears))
    *lead, last = runner.gears.values()
    rows = [(*(g[0] for g in lead), g) for g in last]
    samples = []
    for row, x in zip(rows, inputs(model, dims, rows), strict=True):
        tokens = math.prod(row)
        seconds = []
        low, high = CALIBRATION_REPEATS
        for _ in range(min(high, max(low, CALIBRATION_TOKENS // tokens))):
            began = time.thread_time()
            runner.run(x)
            seconds.append(time.thread_time() - began)
        samples.append((tokens, pairs(dims, row), float(np.median(seconds))))
    return samples


def model_for(name: str) -> tuple[Callable[[], Model], dict[str, Any]]:
    """The demo's model by name, and its description: `block` (`block.Model`) or `llama`
    (`llama.DemoLlama`, which needs the demo extra)."""
    if name == "llama":
        from gearshift.tools.demo import llama

        shape = llama.LlamaShape()
        about = {"width": shape.hidden, "heads": shape.heads, "about": llama.about(shape)}
        return llama.DemoLlama, about
    return block.Model, {"width": WIDTH, "heads": HEADS, "about": MODEL}


def _settle(arm: AdaptiveArm) -> dict[str, Any]:
    began, cpu = time.monotonic(), process_cpu()
    arm.settle()
    return {"seconds": time.monotonic() - began, "cpu": process_cpu() - cpu,
            "profiles": arm.figures()}


def main(conn: Connection, index: int, progress: Any, queues: Sequence[Any],
         origin: Any, tp: tuple[int, Sequence[int]] = (1, ())) -> None:
    """The worker's command loop (module docstring); `queues` are the arms' row counters and
    `origin` the adaptive arm's start (shared `Value`s: `TraceClock`); `tp`: the ranks of an
    instance and each instance's port (tensor parallel: this worker is rank `index % ranks`
    of instance `index // ranks`, `lockstep`)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    torch.set_num_threads(1)  # N workers share the cores: one thread each
    make: Callable[[], Model] = block.Model
    runner: Callable[[Model, Mapping[str, Dim]], Runner] = runner_for
    kept: dict[str, tuple[Model, Runner]] = {}  # the static arm's model and runner, by profile
    arms: dict[str, Arm] = {}
    stack = ExitStack()
    workers = len(progress) // (3 * len(ARMS))
    ranks, ports = tp
    instance, rank = divmod(index, ranks)
    step: Any = None  # tensor parallel: this rank's `lockstep.Lockstep`

    def static_runner(profile: str, dims: Mapping[str, Dim]) -> tuple[Model, Runner]:
        if profile not in kept:
            model = make()
            kept[profile] = model, runner(model, dims)
        return kept[profile]

    def reporter(arm: str) -> Callable[[int, int, int], None]:
        at = 3 * (index + ARMS.index(arm) * workers)
        if rank:  # an instance's progress is its driver's
            return lambda *_: None

        def report(*figures: int) -> None:
            progress[at : at + 3] = figures

        return report

    def calibrated(dims: Mapping[str, Mapping[str, Dim]]) -> dict[str, Any]:
        return {p: calibrate(*static_runner(p, d)) for p, d in dims.items()}

    def prepare(namespace: str, profiles: Mapping[str, tuple[Any, Any, Any]],
                which: np.ndarray, local: np.ndarray, times: np.ndarray) -> None:
        lanes = {p: (*static_runner(p, dims), sizes) for p, (dims, _, sizes) in profiles.items()}
        clock = TraceClock(times, origin, queues[ARMS.index("adaptive")])
        priced = {p: (dims, sizes) for p, (_, dims, sizes) in profiles.items()}
        if step is None:
            arms["static"] = static_arm(lanes, which, local, reporter("static"))
            client = stack.enter_context(gs.connect(namespace, clock=clock,
                                                    memory=lambda: MEMORY))
            arms["adaptive"] = AdaptiveArm(client, priced, which, local, reporter("adaptive"),
                                           lambda p: kept[p][0], runner)
            return
        from gearshift.tools.demo import lockstep

        arms["static"] = static_arm(lanes, which, local, reporter("static"),
                                    partial(lockstep.LockstepArm, step=step))
        client = stack.enter_context(gs.connect(namespace, device=index, clock=clock,
                                                memory=lambda: MEMORY))  # a device per rank
        arms["adaptive"] = lockstep.GroupedArm(client, priced, which, local,
                                               reporter("adaptive"), lambda p: kept[p][0],
                                               runner, step=step,
                                               name=f"demo-instance-{instance}")
        arms["adaptive"].settle()  # the initial gears usable before the run

    def choose(name: str, compile: tuple[str, str, str] | None = None) -> dict[str, Any]:
        nonlocal make, runner, step  # ("model", ...): before any other command
        make, about = model_for(name)
        if ranks > 1:  # the Llama, sharded (the command line refused other models)
            from gearshift.tools.demo import lockstep, tp

            comms = tp.join(rank, ranks, ports[instance])
            stack.callback(tp.leave)
            step = lockstep.Lockstep(comms, make() if rank == 0 else None)  # the unsharded
            make = partial(tp.ShardedLlama, rank, ranks, comms.model)
        if compile is not None:
            from gearshift.tools.demo import compiled

            backend, namespace, directory = compile
            runner = compiled.runner_maker(backend, compiled.prepare_cache(namespace, directory))
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
        "calibrate": calibrated,
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
