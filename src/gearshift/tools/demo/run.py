"""The demo run: worker processes, the embedded controller, a static and an adaptive run.

1. Start N worker processes (spawn: each imports torch) and wait until all are ready.
2. Calibrate: every worker captures the initial gears and times replays of each (CPU time);
   a least-squares `Cost` of those times, and the cores this process may use, fix the stride
   (one row in k, k >= 1 maybe fractional, so that the static run takes about RUN_SHARE of
   the time left) and the time compression (the trace's duration over that run's expected
   duration).
3. Static run: the workers replay the rows on the initial gears they captured, each
   taking the next row when it is free (one shared counter), as a server's workers take
   requests off one queue: they move through the trace together, in order.
4. Adaptive run: the controller runs embedded in this process (a daemon thread, the same loop
   as `gearshift serve`) with the policy's durations (windows, protection, intervals)
   multiplied by the stride and divided by the compression: a window and a round hold as many
   replayed requests as at the trace's full rate, so decision rounds and captures weigh per
   request what they weigh in service (the policy sees the trace's drift stride times faster);
   its slot scans and status documents keep the sidecar's wall-clock cadence; every worker
   connects, registers the profile, captures the initial gears and takes rows as in the
   static run; then the controller stops.

Each run starts when every worker has captured its initial gears (`("go",)` to all), so
start-up captures time neither run; captures of gears added meanwhile are in. A run's wall
time is from the first worker's start to the last one's end; its CPU time is the workers'
(all their threads) plus the controller's (this process's threads but the main one), so
`cpu_speedup` compares the work each run cost even when other processes share the machine;
this process's main thread (progress, gear watch) is instrumentation, reported apart.
While a run goes, `report` gets a Progress every REPORT_SECONDS. This process reads the
device's snapshot region as a worker does: the gears of every version published give the
time-weighted mean gears, adds and evictions (a version published and replaced between two
looks is counted in `versions_missed`, its changes netted into the next one's).

Cleanup, also on Ctrl-C (KeyboardInterrupt), SIGTERM or an error: workers are asked to exit,
then terminated, then killed; the controller stops (its final scan reclaims killed workers'
slots and it removes the namespace once no worker lives); `shm.cleanup` removes anything
left; the state file goes with its temporary directory.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import tempfile
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack, suppress
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from gearshift import protocol
from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller, EmbeddedController
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Gears
from gearshift.errors import GearshiftError
from gearshift.shm import SnapshotRegion, cleanup
from gearshift.tools.demo.clock import TraceClock
from gearshift.tools.demo.workload import HEADS, MODEL, PROFILE, WIDTH, Cost, Workload, stride_for

log = logging.getLogger(__name__)
READY_TIMEOUT = 300.0  # seconds for N workers to import torch on a loaded machine
POLL_SECONDS = 0.1
REPORT_SECONDS = 0.5
EXIT_TIMEOUT = 5.0
# The embedded controller's loop: 5 Hz, not the sidecar's 100 Hz, on a machine whose cores the
# workers fill (its rings hold 65 536 events; a round sees events 200 ms late at most).
DRAIN_SECONDS = 0.2
RUN_SHARE = 0.53  # of the time left after calibration, for the static run (the adaptive is faster)


@dataclass(frozen=True)
class Progress:
    """One look at a run: requests done, padding so far (padded / useful tokens - 1), the
    gears per dim in use and the snapshot version (adaptive)."""

    run: str
    seconds: float
    done: int
    total: int
    padding: float
    gears: dict[str, int]
    version: int | None


Report = Callable[[Progress], None]


def _worker(conn: Connection, index: int, *shared: Any) -> None:
    from gearshift.tools.demo import worker  # torch is imported in the workers only

    worker.main(conn, index, *shared)


class GearWatch:
    """The demo profile's gears on device 0 as the snapshot region publishes them."""

    def __init__(self, namespace: str, gears: Mapping[str, Gears], now: float) -> None:
        self.namespace = namespace
        self.gears = dict(gears)
        self.region: SnapshotRegion | None = None
        self.version = 0
        self.adds = self.evictions = self.missed = 0
        self.began = self.since = now
        self.area = dict.fromkeys(gears, 0.0)  # gear count x seconds

    def poll(self, now: float) -> None:
        for d, g in self.gears.items():
            self.area[d] += len(g) * (now - self.since)
        self.since = now
        if self.region is None:
            with suppress(FileNotFoundError):
                self.region = SnapshotRegion.attach(self.namespace, 0)
            if self.region is None:
                return
        if self.region.version() == self.version:
            return
        snapshot = self.region.read()
        gears = protocol.profile_gears(snapshot.payload, PROFILE) if snapshot else None
        if snapshot is None or gears is None:
            return
        if self.version:
            self.missed += snapshot.version - self.version - 1
        for d, new in gears.items():
            self.adds += len(set(new) - set(self.gears[d]))
            self.evictions += len(set(self.gears[d]) - set(new))
        self.gears, self.version = gears, snapshot.version

    def mean(self) -> dict[str, float]:
        span = self.since - self.began
        return {d: a / span if span else len(self.gears[d]) for d, a in self.area.items()}

    def close(self) -> None:
        if self.region is not None:
            self.region.close()


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
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        self.controller: EmbeddedController | None = None

    def run(self) -> dict[str, Any]:
        began = time.monotonic()
        with ExitStack() as stack:
            state_dir = stack.enter_context(tempfile.TemporaryDirectory(prefix="gearshift-demo"))
            stack.callback(self._cleanup)  # before the state directory goes
            self._start()
            every = range(self.workers)
            timed = self._ask(every, "calibrate", self.full.dims)
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

    # processes

    def _start(self) -> None:
        for i in range(self.workers):
            ours, theirs = self.ctx.Pipe()
            proc = self.ctx.Process(
                target=_worker,
                args=(theirs, i, self.progress, self.queue, self.origin),
                name=f"gearshift-demo-{i}",
                daemon=True,
            )
            # Ctrl-C is this process's to handle: a worker inherits SIGINT ignored from its
            # first instruction (a blocked mask is not inherited through spawn), so one
            # interrupted while it imports torch prints no traceback
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                proc.start()
            finally:
                signal.signal(signal.SIGINT, previous)
            theirs.close()
            self.procs.append(proc)
            self.conns.append(ours)
        self._collect(range(self.workers), "ready", time.monotonic() + READY_TIMEOUT)

    def _ask(self, workers: range, command: str, *args: Any) -> list[Any]:
        for i in workers:
            self.conns[i].send((command, *args))
        return self._collect(workers, command, time.monotonic() + READY_TIMEOUT)

    def _collect(
        self,
        workers: range,
        command: str,
        deadline: float,
        tick: Callable[[], None] | None = None,
    ) -> list[Any]:
        """Each worker's reply to `command`, calling `tick` between looks; GearshiftError if a
        worker fails, dies or the deadline passes."""
        replies: dict[int, Any] = {}
        while len(replies) < len(workers):
            waiting = {self.conns[i]: i for i in workers if i not in replies}
            for conn in wait(list(waiting), timeout=POLL_SECONDS):
                i = waiting[conn]
                try:
                    kind, value = conn.recv()
                except EOFError:
                    raise GearshiftError(f"demo worker {i} died during {command}") from None
                if kind == "error":
                    raise GearshiftError(f"demo worker {i} failed during {command}:\n{value}")
                assert kind == command, (kind, command)
                replies[i] = value
            if time.monotonic() > deadline:
                raise GearshiftError(f"demo workers timed out during {command}")
            if tick is not None:
                tick()
        return [replies[i] for i in workers]

    # the runs

    def _run(self, name: str, workload: Workload, cost: Cost, *args: Any) -> dict[str, Any]:
        self.queue.value = 0  # before the adaptive run's clock reads it (origin still 0)
        for conn in self.conns:
            conn.send((name, *args))
        every = range(self.workers)
        self._collect(every, "prepared", time.monotonic() + READY_TIMEOUT)
        gears = {d: dim.initial_gears for d, dim in workload.dims.items()}
        self.progress[:] = [0] * len(self.progress)
        now = began = next_report = time.monotonic()
        cpu, main_cpu = time.process_time(), time.thread_time()
        rounds = dict(self.controller.controller.rounds) if self.controller else None
        if name == "adaptive":
            self.origin.value = time.monotonic()  # the TraceClock starts
        for conn in self.conns:
            conn.send(("go",))
        watch = GearWatch(self.namespace, gears, now) if name == "adaptive" else None

        def tick() -> None:
            nonlocal next_report
            now = time.monotonic()
            if watch is not None:
                watch.poll(now)
            if now >= next_report:
                next_report = now + REPORT_SECONDS
                self.report(self._progress(name, now - began, workload, watch, gears))

        deadline = began + max(READY_TIMEOUT, 20 * self.seconds)
        try:
            results = self._collect(every, name, deadline, tick)
            tick()
            demo = time.thread_time() - main_cpu
            figures = self._figures(results, workload, watch, cost)
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

    def _progress(
        self,
        name: str,
        seconds: float,
        workload: Workload,
        watch: GearWatch | None,
        gears: dict[str, Gears],
    ) -> Progress:
        p = list(self.progress)
        useful, padded = sum(p[1::3]), sum(p[2::3])
        return Progress(
            name,
            seconds,
            sum(p[0::3]),
            workload.events,
            padded / useful - 1.0 if useful else 0.0,
            {d: len(g) for d, g in (watch.gears if watch else gears).items()},
            watch.version if watch else None,
        )

    def _figures(
        self,
        results: list[dict[str, Any]],
        workload: Workload,
        watch: GearWatch | None,
        cost: Cost,
    ) -> dict[str, Any]:
        def total(key: str) -> int:
            return sum(r[key] for r in results)

        seconds = max(r["ended"] for r in results) - min(r["began"] for r in results)
        useful = total("useful")
        model = cost.seconds(0, total("padded"), total("padded_pairs"))
        dims = {}
        for d, dim in workload.dims.items():
            raw = sum(r["dims"][d][0] for r in results)
            padded = sum(r["dims"][d][1] for r in results)
            dims[d] = {
                "padding_overhead": padded / raw - 1.0,
                "mean_gears": watch.mean()[d] if watch else float(len(dim.initial_gears)),
                "final_gears": list(watch.gears[d] if watch else dim.initial_gears),
            }
        lag = None
        if self.controller is not None:  # read before the controller stops
            found = self.controller.controller.lags.get(0)
            if found is not None and found.count:
                lag = {
                    "mean_ms": found.seconds_sum / found.count * 1e3,
                    "last_ms": (found.last_seconds or 0.0) * 1e3,
                    "count": found.count,
                }
        return {
            "seconds": seconds,
            "requests": total("requests"),
            "useful_tokens": useful,
            "useful_tokens_per_second": useful / seconds,
            "padded_tokens": total("padded"),
            "padding_overhead": total("padded") / useful - 1.0,
            "model_seconds": model,
            "compute_overhead": model / cost.seconds(0, useful, total("useful_pairs")) - 1.0,
            "replayed_tokens": total("computed") - total("capture_tokens"),
            "captured_tokens": total("capture_tokens"),
            "worker_cpu_seconds": total("cpu"),
            "capture_cpu_seconds": total("capture_cpu"),
            "worker_peak_rss_mb": max(r["rss_mb"] for r in results),
            "dims": dims,
            "adds": watch.adds if watch else 0,
            "evictions": watch.evictions if watch else 0,
            "captures": total("captures"),
            "replays": total("replays"),
            "eager": total("eager"),
            "snapshot_version": watch.version if watch else None,
            "versions_missed": watch.missed if watch else None,
            "propagation_lag": lag,
        }

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
        for conn in self.conns:
            with suppress(OSError):
                conn.send(("exit",))
        deadline = time.monotonic() + EXIT_TIMEOUT
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for stop in ("terminate", "kill"):
            alive = [p for p in self.procs if p.is_alive()]
            for proc in alive:
                getattr(proc, stop)()
            for proc in alive:
                proc.join(EXIT_TIMEOUT)
        for conn in self.conns:
            conn.close()
        self._stop_controller()
        try:
            cleanup(self.namespace)
        except GearshiftError as e:
            log.warning("demo: namespace %r not removed: %s", self.namespace, e)
