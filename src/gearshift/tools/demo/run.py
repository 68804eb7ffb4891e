"""The demo run: calibration, then a static and an adaptive run over the same rows.

`Demo.run()` starts the workers (`processes`), fits the model's `Cost` and the stride, replays
the rows on the initial gears, then again through the controller embedded in this process on
the trace's compressed time (`clock`), and returns the figures (`figures`). Each run starts
once every worker has captured its initial gears; everything started is ended, also on Ctrl-C,
SIGTERM or an error. The steps, the scaling and what is timed: docs/tools.md.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import tempfile
import time
from contextlib import ExitStack
from dataclasses import asdict
from typing import Any

from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller, EmbeddedController
from gearshift.core.config import PolicyConfig
from gearshift.errors import GearshiftError
from gearshift.shm import cleanup
from gearshift.tools.demo.clock import TraceClock
from gearshift.tools.demo.figures import Report, progress, propagation_lag, run_figures
from gearshift.tools.demo.processes import READY_TIMEOUT, WorkerProcesses
from gearshift.tools.demo.watch import GearWatch
from gearshift.tools.demo.workload import HEADS, MODEL, WIDTH, Cost, Workload, stride_for

log = logging.getLogger(__name__)
REPORT_SECONDS = 0.5
# The embedded controller's loop: 5 Hz, not the sidecar's 100 Hz, on a machine whose cores the
# workers fill (its rings hold 65 536 events; a round sees events 200 ms late at most).
DRAIN_SECONDS = 0.2
RUN_SHARE = 0.53  # of the time left after calibration, for the static run (the adaptive is faster)


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
    ) -> None:
        self.full, self.workers, self.seconds = workload, workers, seconds
        self.namespace, self.policy, self.report = namespace, policy, report
        self.ctx = multiprocessing.get_context("spawn")
        self.progress = self.ctx.RawArray("q", 3 * workers)
        self.queue = self.ctx.Value("q", 0)  # the next row a worker takes
        self.origin = self.ctx.Value("d", 0.0)  # the adaptive run's start (TraceClock)
        self.processes = WorkerProcesses(self.ctx, (self.progress, self.queue, self.origin))
        self.controller: EmbeddedController | None = None

    def run(self) -> dict[str, Any]:
        began = time.monotonic()
        with ExitStack() as stack:
            state_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="gearshift-demo"))
            stack.callback(self._cleanup)  # before the state directory goes
            self.processes.start(self.workers)
            every = range(self.workers)
            timed = self.processes.ask(every, "calibrate", self.full.dims)
            cost = Cost.fit([sample for samples in timed for sample in samples])
            budget = max(1.0, (self.seconds - (time.monotonic() - began)) * RUN_SHARE)
            parallel = min(self.workers, len(os.sched_getaffinity(0)))
            workload = self.full.every(stride_for(self.full, cost, budget, parallel))
            factor = workload.duration / budget
            static = self._run("static", workload, cost, workload.dims, workload.sizes)
            times = workload.times / factor
            config = ControllerConfig(  # on trace time: the sidecar's wall-clock cadences
                namespace=self.namespace,
                state_dir=state_dir,
                drain_interval_seconds=DRAIN_SECONDS,
                scan_interval_seconds=ControllerConfig.scan_interval_seconds * factor,
                status_interval_seconds=ControllerConfig.status_interval_seconds * factor,
            )
            clock = TraceClock(times, self.origin, self.queue)
            policy = self.policy.scaled(factor / workload.stride)
            self.controller = Controller.start_embedded(config, policy, clock=clock)
            args = (self.namespace, cost.priced(workload.dims), workload.sizes, times)
            adaptive = self._run("adaptive", workload, cost, *args)
            self._stop_controller()
        return {
            "trace": workload.trace,
            "model": {"width": WIDTH, "heads": HEADS, "about": MODEL, "cost": asdict(cost)},
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
        }

    # the runs

    def _run(self, name: str, workload: Workload, cost: Cost, *args: Any) -> dict[str, Any]:
        self.queue.value = 0  # before the adaptive run's clock reads it (origin still 0)
        self.processes.send(name, *args)
        every = range(self.workers)
        self.processes.collect(every, "prepared", time.monotonic() + READY_TIMEOUT)
        gears = {d: dim.initial_gears for d, dim in workload.dims.items()}
        self.progress[:] = [0] * len(self.progress)
        now = began = next_report = time.monotonic()
        cpu, main_cpu = time.process_time(), time.thread_time()
        rounds = dict(self.controller.controller.rounds) if self.controller else None
        if name == "adaptive":
            self.origin.value = time.monotonic()  # the TraceClock starts
        self.processes.send("go")
        watch = GearWatch(self.namespace, gears, now) if name == "adaptive" else None

        def tick() -> None:
            nonlocal next_report
            now = time.monotonic()
            if watch is not None:
                watch.poll(now)
            if now >= next_report:
                next_report = now + REPORT_SECONDS
                self.report(progress(name, now - began, self.progress, workload, watch, gears))

        deadline = began + max(READY_TIMEOUT, 20 * self.seconds)
        try:
            results = self.processes.collect(every, name, deadline, tick)
            tick()
            demo = time.thread_time() - main_cpu
            lag = None
            if self.controller is not None:  # read before the controller stops
                lag = propagation_lag(self.controller.controller.lags.get(0))
            figures = run_figures(results, workload, watch, cost, lag)
            figures["controller_cpu_seconds"] = time.process_time() - cpu - demo
            figures["demo_cpu_seconds"] = demo
            spent = figures["worker_cpu_seconds"] + figures["controller_cpu_seconds"]
            figures["useful_tokens_per_cpu_second"] = figures["useful_tokens"] / spent
            figures["decision_rounds"] = self._rounds(rounds)
            return figures
        finally:
            if watch is not None:
                watch.close()

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
