"""The demo run: calibration, then the static and the adaptive arm in alternating slices.

`Demo.run()` starts the workers (`processes`), fits each profile's `Cost` and the stride of the
`Mix`, starts the controller embedded in this process on the trace's compressed time (`clock`),
prepares both arms in every worker (each captures its initial gears, every profile's), then
replays the merged rows in slices: each slice's rows by one arm, then the same rows by the
other (which goes first alternates), so that both arms run the same requests at nearly the
same time and a neighbour's load falls on both alike. After each adaptive slice the controller
folds it and decides, and the workers capture the new gears (`settle`, counted in the adaptive
slice), so that no adaptive work runs in a static slice. The figures (`figures`) add the
slices up per arm and profile, and over the profiles; each speedup comes with its spread over
the slices. Everything started is ended, also on Ctrl-C, SIGTERM or an error. The steps, the
scaling and what is timed: docs/tools.md.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import signal
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict
from typing import Any

import numpy as np

from gearshift.controller import embedded
from gearshift.controller.config import ControllerConfig
from gearshift.controller.embedded import EmbeddedController
from gearshift.core import memory
from gearshift.core.config import PolicyConfig
from gearshift.errors import GearshiftError
from gearshift.shm import cleanup
from gearshift.tools.demo.clock import TraceClock
from gearshift.tools.demo.figures import (
    Report,
    instances,
    lockstep,
    overall,
    progress,
    propagation_lag,
    run_figures,
    split,
    spreads,
)
from gearshift.tools.demo.mix import Mix, paced, slice_ends, stride_for
from gearshift.tools.demo.processes import (
    READY_TIMEOUT,
    WorkerProcesses,
    compile_allowance,
    free_port,
)
from gearshift.tools.demo.watch import GearWatch
from gearshift.tools.demo.workload import HEADS, MODEL, WIDTH, Cost

log = logging.getLogger(__name__)
REPORT_SECONDS = 0.5
# The embedded controller's loop: 5 Hz, not the sidecar's 100 Hz, on a machine whose cores the
# workers fill (its rings hold 65 536 events; a round sees events 200 ms late at most).
DRAIN_SECONDS = 0.2
SETTLE_WAIT = 2 * DRAIN_SECONDS  # after an adaptive slice: the controller folds it, decides
RUN_SHARE = 0.53  # of the time left after calibration, for the static arm (the adaptive is faster)
SLICE_SECONDS = 2.0  # the static half of a slice, about: short, so both halves share a load
SLICES = (4, 16)  # bounds on the number of slices
ARMS = ("static", "adaptive")  # worker.ARMS: the order of the progress array and the counters


class Demo:
    """One demo of the merged rows of `mix` (one profile or more): `run()` returns the figures
    (see `cli`); everything it starts it ends."""

    def __init__(
        self,
        mix: Mix,
        workers: int,
        seconds: float,
        namespace: str,
        policy: PolicyConfig,
        report: Report,
        model: str = "block",
        compile: str | None = None,
        tp: int = 1,
    ) -> None:
        self.full, self.workers, self.seconds = mix, workers, seconds
        self.tp, self.procs = tp, workers * tp  # ranks an instance, worker processes
        self.model = model  # worker.model_for's name
        self.compile = compile  # the Dynamo backend of the compile backend; None: eager graphs
        self.namespace, self.policy, self.report = namespace, policy, report
        self.ctx = multiprocessing.get_context("spawn")
        self.progress = self.ctx.RawArray("q", 3 * len(ARMS) * self.procs)
        self.queues = tuple(self.ctx.Value("q", 0) for _ in ARMS)  # each arm's next row
        self.origin = self.ctx.Value("d", 0.0)  # the adaptive arm's start (TraceClock)
        ports = tuple(free_port() for _ in range(workers)) if tp > 1 else ()  # an instance's
        self.processes = WorkerProcesses(self.ctx, (self.progress, self.queues, self.origin,
                                                    (tp, ports)), tp)
        self.controller: EmbeddedController | None = None

    def run(self) -> dict[str, Any]:
        began = time.monotonic()
        with ExitStack() as stack:
            state_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="gearshift-demo"))
            stack.callback(self._cleanup)  # before the state directory goes
            self.processes.start(self.procs)
            every = range(self.procs)
            about = {"width": WIDTH, "heads": HEADS, "about": MODEL}
            if self.compile is not None:  # both arms', every worker's: one cache of its own
                cache = (self.compile, self.namespace, os.path.join(state_dir, "compile"))
                about = self.processes.ask(every, "model", self.model, cache)[0]
            elif self.model != "block":
                about = self.processes.ask(every, "model", self.model)[0]
            dims = {p: w.dims for p, w in self.full.profiles.items()}
            initial = self._allowance({p: {d: dim.initial_gears for d, dim in w.items()}
                                       for p, w in dims.items()})
            timed = self.processes.ask(every, "calibrate", dims, allowance=initial)
            costs = {p: Cost.fit([s for samples in timed for s in samples[p]]) for p in dims}
            # compiling, the start-up (the initial gears' compiles) is not in --seconds
            left = self.seconds - (time.monotonic() - began) * (self.compile is None)
            count = int(np.clip(round(left * RUN_SHARE / SLICE_SECONDS), *SLICES))
            budget = max(1.0, (left - count * SETTLE_WAIT) * RUN_SHARE)
            parallel = min(self.workers, len(os.sched_getaffinity(0)) / self.tp)
            mix = self.full.every(stride_for(self.full, costs, budget, parallel))
            factor = mix.duration / budget
            times = mix.times / factor
            config = ControllerConfig(  # on trace time: the sidecar's wall-clock cadences
                namespace=self.namespace,
                state_dir=state_dir,
                drain_interval_seconds=DRAIN_SECONDS,
                scan_interval_seconds=ControllerConfig.scan_interval_seconds * factor,
                status_interval_seconds=ControllerConfig.status_interval_seconds * factor,
            )
            clock = TraceClock(times, self.origin, self.queues[ARMS.index("adaptive")])
            policy = paced(self.policy, factor, mix.stride)
            self.controller = embedded.start(config, policy, clock=clock)
            profiles = {p: (w.dims, costs[p].priced(w.dims), w.sizes)
                        for p, w in mix.profiles.items()}
            self.processes.ask(every, "prepare", self.namespace, profiles, mix.which, mix.local,
                               times, allowance=initial)
            arms, per_profile = self._interleave(mix, costs, slice_ends(mix, costs, count))
            self.processes.ask(every, "finish")
            self._stop_controller()
        return {
            "trace": mix.name,
            "model": about,
            "backend": "compile" if self.compile else "graphs",
            "compile_backend": self.compile,
            "workers": self.workers,
            "tp": self.tp,
            "rows": mix.rows,
            "stride": mix.stride,
            "requests": mix.events,
            "time_compression": factor,
            "round_interval": self.policy.update_interval_seconds * mix.stride,
            "seconds": time.monotonic() - began,
            **arms,
            "profiles": {
                p: {"trace": w.trace, "rows": w.rows, "requests": w.events,
                    "cost": asdict(costs[p]), **per_profile[p]}
                for p, w in mix.profiles.items()
            },
        }

    # the slices

    def _interleave(
        self, mix: Mix, costs: dict[str, Cost], ends: list[int]
    ) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """Both arms over the merged rows, slice by slice: each arm's figures over every
        profile, with the speedups and their spreads, and the same per profile."""
        every, names = range(self.procs), mix.names
        gears = {p: {d: dim.initial_gears for d, dim in w.dims.items()}
                 for p, w in mix.profiles.items()}
        rounds = {"count": self._round_count()} if self.controller else None
        self.origin.value = time.monotonic()  # the TraceClock starts: still while static runs
        watches = {p: GearWatch(self.namespace, gears[p], 0.0, p) for p in names}  # adaptive s
        # per arm, per slice: wall seconds, workers' and controller's CPU, the lanes' reports
        done: dict[str, list[tuple[float, float, float, dict[str, list[Any]]]]] = {
            arm: [] for arm in ARMS}
        demo, rss = dict.fromkeys(ARMS, 0.0), dict.fromkeys(ARMS, 0.0)
        checks: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}  # tensor parallel
        began = time.monotonic()
        elapsed = 0.0  # adaptive seconds so far: the watches' clock
        try:
            for k, end in enumerate(ends):
                outside = [0.0, 0.0]  # the adaptive arm's workers' and controller's CPU, all
                this = {}
                for arm in ARMS if k % 2 == 0 else ARMS[::-1]:
                    process, thread = time.process_time(), time.thread_time()
                    # the watches' clock in this slice: adaptive seconds at its start, on
                    shift = elapsed - time.monotonic() if arm == "adaptive" else None
                    replies = self._slice(arm, end, mix, watches, shift, gears, began)
                    wall = max(r["ended"] for r in replies) - min(r["began"] for r in replies)
                    reports = instances([r["profiles"] for r in replies], self.tp)
                    checks[arm] += [r["lockstep"] for r in replies[::self.tp] if "lockstep" in r]
                    if arm == "adaptive":
                        time.sleep(SETTLE_WAIT)  # the controller folds the slice and decides
                        settled = self.processes.ask(
                            every, "settle", allowance=self._allowance(
                                {p: w.gears for p, w in watches.items()}))
                        wall += max(s["seconds"] for s in settled)
                        work = sum(r["cpu"] for r in replies) + sum(s["cpu"] for s in settled)
                        reports += instances([s["profiles"] for s in settled], self.tp)
                        elapsed += wall
                        for watch in watches.values():
                            watch.poll(elapsed)
                    elif self.tp > 1:  # its processes: gloo's threads run the collectives
                        work = sum(r["cpu"] for r in replies)
                    else:  # its request threads; the adaptive client's swap threads apart
                        work = sum(r["thread_cpu"] for r in replies)
                        outside[0] += sum(r["cpu"] - r["thread_cpu"] for r in replies)
                    main = time.thread_time() - thread
                    demo[arm] += main
                    outside[1] += time.process_time() - process - main
                    rss[arm] = max(rss[arm], *(r["rss_mb"] for r in replies))
                    this[arm] = wall, work, {p: [r[p] for r in reports] for p in names}
                for arm in ARMS:
                    wall, work, lanes = this[arm]
                    extra = outside if arm == "adaptive" else [0.0, 0.0]
                    done[arm].append((wall, work + extra[0], extra[1], lanes))
            lag, measured, held = None, {}, None
            if self.controller is not None:  # read before the controller stops
                lag = propagation_lag(self.controller.controller.lags.get(0))
                c = self.controller.controller
                if 0 in c.devices:
                    c.device_memory(0)
                    held = dict(zip(("held", "bound", "buffers"), memory.device_usage(
                        c.devices[0], c.prices(0), c.policy), strict=True))
                book = self.controller.controller.costs
                measured = {p: {d: c.summary() for d, c in book.costs(0, p).items()}
                            for p in mix.names}
            arms, profiles = self._figures(mix, costs, done, watches, lag, rss, demo, rounds)
            for p, dims in measured.items():
                profiles[p]["adaptive"]["measured_costs"] = dims
            if held is not None:
                arms["adaptive"]["graph_bytes"] = held
            for arm in ARMS if self.tp > 1 else ():
                arms[arm]["lockstep"] = lockstep(checks[arm])
            return arms, profiles
        finally:
            for watch in watches.values():
                watch.close()

    def _figures(self, mix: Mix, costs: dict[str, Cost], done: dict[str, list[Any]],
                 watches: dict[str, GearWatch], lag: dict[str, float] | None,
                 rss: dict[str, float], demo: dict[str, float],
                 rounds: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any]]:
        """The figures of `_interleave` from its slices `done`."""
        names = mix.names
        arms: dict[str, Any] = {}
        profiles: dict[str, dict[str, Any]] = {p: {} for p in names}
        # per arm, per slice: (wall, CPU seconds) of each profile, and of all (None)
        slices: dict[str, list[dict[str | None, tuple[float, float]]]] = {}
        for arm in ARMS:
            adaptive = arm == "adaptive"
            parts = [split(*s) for s in done[arm]]
            figures = {}
            for p in names:
                results = [r for *_, lanes in done[arm] for r in lanes[p]]
                wall, workers, controller = (sum(part[p][i] for part in parts) for i in range(3))
                figures[p] = profiles[p][arm] = run_figures(
                    results, wall, workers, controller, mix.profiles[p],
                    watches[p] if adaptive else None, costs[p], lag if adaptive else None,
                    rss[arm])
            arms[arm] = overall(figures, *(sum(s[i] for s in done[arm]) for i in range(3)))
            arms[arm]["demo_cpu_seconds"] = demo[arm]
            arms[arm]["decision_rounds"] = self._rounds(rounds) if adaptive else None
            slices[arm] = [{None: (s[0], s[1] + s[2]),
                            **{p: (part[p][0], part[p][1] + part[p][2]) for p in names}}
                           for s, part in zip(done[arm], parts, strict=True)]
        for key, out in [*profiles.items(), (None, arms)]:
            wall = {arm: [s[key][0] for s in slices[arm]] for arm in ARMS}
            cpu = {arm: [s[key][1] for s in slices[arm]] for arm in ARMS}
            out.update(_speedups(out["static"], out["adaptive"]), **spreads(wall, cpu))
        return arms, profiles

    def _slice(self, arm: str, end: int, mix: Mix, watches: dict[str, GearWatch],
               shift: float | None, gears: dict[str, dict[str, Any]],
               began: float) -> list[dict[str, Any]]:
        """One arm's slice up to merged row `end`, in every worker; their replies. The adaptive
        arm's slice polls `watches` at CLOCK_MONOTONIC + `shift` (adaptive seconds)."""
        self.processes.send("slice", arm, end)
        every = range(self.procs)
        at = ARMS.index(arm) * 3 * self.procs
        next_report = 0.0

        def tick() -> None:
            nonlocal next_report
            now = time.monotonic()
            if shift is not None:
                for watch in watches.values():
                    watch.poll(now + shift)
            if now >= next_report:
                next_report = now + REPORT_SECONDS
                counts = self.progress[at : at + 3 * self.procs]
                seen = {p: w.gears for p, w in watches.items()} if shift is not None else gears
                version = next(iter(watches.values())).version if shift is not None else None
                self.report(progress(arm, now - began, counts, mix.events, _counts(seen),
                                     version))

        seen = {p: w.gears for p, w in watches.items()} if shift is not None else gears
        deadline = time.monotonic() + max(READY_TIMEOUT, 20 * self.seconds) + \
            self._allowance(seen)
        replies = self.processes.collect(every, "slice", deadline, tick)
        next_report = 0.0
        tick()
        return replies

    def _allowance(self, gears: dict[str, dict[str, Any]]) -> float:
        """The seconds a command that may compile the variants of `gears` (profile -> dim ->
        gears) gets beyond its bound: `processes.compile_allowance` for each worker's compile
        of every variant with the compile backend, none with eager graphs."""
        if self.compile is None:
            return 0.0
        count = sum(math.prod(len(v) for v in g.values()) for g in gears.values())
        return compile_allowance(count, self.workers)

    def _rounds(self, before: dict[str, Any] | None) -> dict[str, int] | None:
        """How many decision rounds the controller ran since `before` (their durations, read
        on the trace clock, are no cost: the controller's CPU seconds are)."""
        if before is None or self.controller is None:
            return None
        return {"count": self._round_count() - before["count"]}

    def _round_count(self) -> int:
        """The controller's decision rounds so far: its devices' and its groups' (--tp)."""
        c = self.controller.controller  # type: ignore[union-attr]
        return c.rounds["count"] + c.group_rounds.rounds

    # cleanup

    def _stop_controller(self) -> None:
        controller, self.controller = self.controller, None
        if controller is not None and not controller.stop():
            log.warning("demo: the embedded controller did not stop in time")

    def _cleanup(self) -> None:
        # a second Ctrl-C or a SIGTERM waits: cut short, the cleanup would leave segments
        previous = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self._end_all()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _end_all(self) -> None:
        self.processes.end()
        self._stop_controller()
        try:
            cleanup(self.namespace)
        except GearshiftError as e:
            log.warning("demo: namespace %r not removed: %s", self.namespace, e)


def _speedups(static: dict[str, Any], adaptive: dict[str, Any]) -> dict[str, float]:
    return {
        "speedup": adaptive["useful_tokens_per_second"] / static["useful_tokens_per_second"],
        "cpu_speedup": adaptive["useful_tokens_per_cpu_second"]
        / static["useful_tokens_per_cpu_second"],
        "compute_ratio": static["model_seconds"] / adaptive["model_seconds"],
    }


def _counts(gears: dict[str, dict[str, Any]]) -> dict[str, int]:
    """Gears per dim of every profile (`profile.dim` for a dim two profiles share)."""
    names = [d for g in gears.values() for d in g]
    return {d if names.count(d) == 1 else f"{p}.{d}": len(v)
            for p, g in gears.items() for d, v in g.items()}
