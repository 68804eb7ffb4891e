"""The demo run: calibration, then the static and the adaptive arm in alternating slices.

`Demo.run()` starts the workers (`processes`), fits the model's `Cost` and the stride, starts
the controller embedded in this process on the trace's compressed time (`clock`), prepares both
arms in every worker (each captures its initial gears), then replays the rows in slices: each
slice's rows by one arm, then the same rows by the other (which goes first alternates), so
that both arms run the same requests at nearly the same time and a neighbour's load falls on
both alike. After each adaptive slice the controller folds it and decides, and the workers
capture the new gears (`settle`, counted in the adaptive slice), so that no adaptive work runs
in a static slice. The figures (`figures`) add the slices up per arm; the speedup comes with
its spread over the slices. Everything started is ended, also on Ctrl-C, SIGTERM or an
error. The steps, the scaling and what is timed: docs/tools.md.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import statistics
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict
from typing import Any

import numpy as np

from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller, EmbeddedController
from gearshift.core.config import PolicyConfig
from gearshift.errors import GearshiftError
from gearshift.shm import cleanup
from gearshift.tools.demo.clock import TraceClock
from gearshift.tools.demo.figures import Report, progress, propagation_lag, run_figures
from gearshift.tools.demo.processes import READY_TIMEOUT, WorkerProcesses
from gearshift.tools.demo.watch import GearWatch
from gearshift.tools.demo.workload import (
    HEADS,
    MODEL,
    WIDTH,
    Cost,
    Workload,
    padded_pairs,
    stride_for,
)

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
    """One demo: `run()` returns the figures (see `cli`); everything it starts it ends."""

    def __init__(
        self,
        workload: Workload,
        workers: int,
        seconds: float,
        namespace: str,
        policy: PolicyConfig,
        report: Report,
        model: str = "block",
    ) -> None:
        self.full, self.workers, self.seconds = workload, workers, seconds
        self.model = model  # worker.model_for's name
        self.namespace, self.policy, self.report = namespace, policy, report
        self.ctx = multiprocessing.get_context("spawn")
        self.progress = self.ctx.RawArray("q", 3 * len(ARMS) * workers)
        self.queues = tuple(self.ctx.Value("q", 0) for _ in ARMS)  # each arm's next row
        self.origin = self.ctx.Value("d", 0.0)  # the adaptive arm's start (TraceClock)
        self.processes = WorkerProcesses(self.ctx, (self.progress, self.queues, self.origin))
        self.controller: EmbeddedController | None = None

    def run(self) -> dict[str, Any]:
        began = time.monotonic()
        with ExitStack() as stack:
            state_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="gearshift-demo"))
            stack.callback(self._cleanup)  # before the state directory goes
            self.processes.start(self.workers)
            every = range(self.workers)
            about = {"width": WIDTH, "heads": HEADS, "about": MODEL}
            if self.model != "block":
                about = self.processes.ask(every, "model", self.model)[0]
            timed = self.processes.ask(every, "calibrate", self.full.dims)
            cost = Cost.fit([sample for samples in timed for sample in samples])
            left = self.seconds - (time.monotonic() - began)
            count = int(np.clip(round(left * RUN_SHARE / SLICE_SECONDS), *SLICES))
            budget = max(1.0, (left - count * SETTLE_WAIT) * RUN_SHARE)
            parallel = min(self.workers, len(os.sched_getaffinity(0)))
            workload = self.full.every(stride_for(self.full, cost, budget, parallel))
            factor = workload.duration / budget
            times = workload.times / factor
            config = ControllerConfig(  # on trace time: the sidecar's wall-clock cadences
                namespace=self.namespace,
                state_dir=state_dir,
                drain_interval_seconds=DRAIN_SECONDS,
                scan_interval_seconds=ControllerConfig.scan_interval_seconds * factor,
                status_interval_seconds=ControllerConfig.status_interval_seconds * factor,
            )
            clock = TraceClock(times, self.origin, self.queues[ARMS.index("adaptive")])
            policy = self.policy.scaled(factor / workload.stride)
            self.controller = Controller.start_embedded(config, policy, clock=clock)
            priced = cost.priced(workload.dims)
            self.processes.ask(every, "prepare", self.namespace, workload.dims, priced,
                               workload.sizes, times)
            arms, slices = self._interleave(workload, cost, slice_ends(workload, cost, count))
            self.processes.ask(every, "finish")
            self._stop_controller()
        static, adaptive = arms["static"], arms["adaptive"]
        return {
            "trace": workload.trace,
            "model": {**about, "cost": asdict(cost)},
            "workers": self.workers,
            "rows": workload.rows,
            "stride": workload.stride,
            "requests": workload.events,
            "time_compression": factor,
            "round_interval": self.policy.update_interval_seconds * workload.stride,
            "seconds": time.monotonic() - began,
            "static": static,
            "adaptive": adaptive,
            "speedup": adaptive["useful_tokens_per_second"] / static["useful_tokens_per_second"],
            "cpu_speedup": adaptive["useful_tokens_per_cpu_second"]
            / static["useful_tokens_per_cpu_second"],
            "compute_ratio": static["model_seconds"] / adaptive["model_seconds"],
            **slices,
        }

    # the slices

    def _interleave(
        self, workload: Workload, cost: Cost, ends: list[int]
    ) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
        """Both arms over the rows, slice by slice; each arm's figures, and the slices'."""
        every = range(self.workers)
        gears = {d: dim.initial_gears for d, dim in workload.dims.items()}
        rounds = dict(self.controller.controller.rounds) if self.controller else None
        self.origin.value = time.monotonic()  # the TraceClock starts: still while static runs
        watch = GearWatch(self.namespace, gears, 0.0)  # in adaptive seconds
        results: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
        seconds: dict[str, list[float]] = {arm: [] for arm in ARMS}  # per slice
        cpu: dict[str, list[float]] = {arm: [] for arm in ARMS}  # per slice, all it cost
        spent = {arm: dict.fromkeys(("workers", "controller", "demo"), 0.0) for arm in ARMS}
        began = time.monotonic()
        elapsed = 0.0  # adaptive seconds so far: the watch's clock
        try:
            for k, end in enumerate(ends):
                extra = 0.0  # the adaptive arm's CPU outside its own slice
                for arm in ARMS if k % 2 == 0 else ARMS[::-1]:
                    process, thread = time.process_time(), time.thread_time()
                    # the watch's clock in this slice: adaptive seconds at its start, on
                    shift = elapsed - time.monotonic() if arm == "adaptive" else None
                    replies = self._slice(arm, end, workload, watch, shift, gears, began)
                    wall = max(r["ended"] for r in replies) - min(r["began"] for r in replies)
                    if arm == "adaptive":
                        time.sleep(SETTLE_WAIT)  # the controller folds the slice and decides
                        settled = self.processes.ask(every, "settle")
                        wall += max(s["seconds"] for s in settled)
                        work = sum(r["cpu"] for r in replies) + sum(s["cpu"] for s in settled)
                        elapsed += wall
                        watch.poll(elapsed)
                    else:  # its request threads; the adaptive client's swap threads apart
                        work = sum(r["thread_cpu"] for r in replies)
                        swap = sum(r["cpu"] - r["thread_cpu"] for r in replies)
                        spent["adaptive"]["workers"] += swap
                        extra += swap
                    main = time.thread_time() - thread
                    controller = time.process_time() - process - main
                    spent[arm]["workers"] += work
                    spent[arm]["demo"] += main
                    spent["adaptive"]["controller"] += controller
                    extra += controller
                    results[arm] += replies
                    seconds[arm].append(wall)
                    cpu[arm].append(work)
                cpu["adaptive"][-1] += extra
            lag = None
            if self.controller is not None:  # read before the controller stops
                lag = propagation_lag(self.controller.controller.lags.get(0))
            arms = {}
            for arm in ARMS:
                adaptive = arm == "adaptive"
                figures = run_figures(results[arm], sum(seconds[arm]), spent[arm]["workers"],
                                      spent[arm]["controller"], workload,
                                      watch if adaptive else None, cost, lag if adaptive else None)
                figures["demo_cpu_seconds"] = spent[arm]["demo"]
                figures["decision_rounds"] = self._rounds(rounds) if adaptive else None
                arms[arm] = figures
            return arms, _spreads(seconds, cpu)
        finally:
            watch.close()

    def _slice(self, arm: str, end: int, workload: Workload, watch: GearWatch,
               shift: float | None, gears: dict[str, Any],
               began: float) -> list[dict[str, Any]]:
        """One arm's slice up to row `end`, in every worker; their replies. The adaptive arm's
        slice polls `watch` at CLOCK_MONOTONIC + `shift` (adaptive seconds)."""
        self.processes.send("slice", arm, end)
        every = range(self.workers)
        at = ARMS.index(arm) * 3 * self.workers
        next_report = 0.0

        def tick() -> None:
            nonlocal next_report
            now = time.monotonic()
            if shift is not None:
                watch.poll(now + shift)
            if now >= next_report:
                next_report = now + REPORT_SECONDS
                counts = self.progress[at : at + 3 * self.workers]
                self.report(progress(arm, now - began, counts, workload,
                                     watch if shift is not None else None, gears))

        deadline = time.monotonic() + max(READY_TIMEOUT, 20 * self.seconds)
        replies = self.processes.collect(every, "slice", deadline, tick)
        next_report = 0.0
        tick()
        return replies

    def _rounds(self, before: dict[str, Any] | None) -> dict[str, int] | None:
        """How many decision rounds the controller ran since `before` (their durations, read
        on the trace clock, are no cost: the controller's CPU seconds are)."""
        if before is None or self.controller is None:
            return None
        return {"count": self.controller.controller.rounds["count"] - before["count"]}

    # cleanup

    def _stop_controller(self) -> None:
        controller, self.controller = self.controller, None
        if controller is not None and not controller.stop():
            log.warning("demo: the embedded controller did not stop in time")

    def _cleanup(self) -> None:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C waits
        try:
            self._end_all()
        finally:
            signal.signal(signal.SIGINT, previous)

    def _end_all(self) -> None:
        self.processes.end()
        self._stop_controller()
        try:
            cleanup(self.namespace)
        except GearshiftError as e:
            log.warning("demo: namespace %r not removed: %s", self.namespace, e)


def slice_ends(workload: Workload, cost: Cost, count: int) -> list[int]:
    """The rows where `count` slices end, cut where the static arm's expected time is shared
    equally (consecutive rows, in trace order; the last ends at the last row)."""
    seconds = cost.seconds(1.0, workload.padded().astype(np.float64),
                           padded_pairs(workload.dims, workload.sizes).astype(np.float64))
    share = np.cumsum(seconds) / float(np.sum(seconds))
    ends = np.searchsorted(share, np.arange(1, count + 1) / count, "left") + 1
    ends[-1] = workload.events
    return sorted({int(e) for e in np.minimum(ends, workload.events)})


def _spreads(seconds: dict[str, list[float]], cpu: dict[str, list[float]]) -> dict[str, Any]:
    """The speedups slice by slice (the same rows for both arms): median, min and max."""

    def spread(static: list[float], adaptive: list[float]) -> dict[str, Any]:
        ratios = [s / a for s, a in zip(static, adaptive, strict=True)]
        return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                "slices": ratios}

    return {
        "slices": len(seconds["static"]),
        "speedup_slices": spread(seconds["static"], seconds["adaptive"]),
        "cpu_speedup_slices": spread(cpu["static"], cpu["adaptive"]),
    }
