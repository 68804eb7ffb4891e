"""The demo run: worker processes, the embedded controller, an adaptive and a static run.

1. Start N worker processes (spawn: each imports torch) and wait until all are ready.
2. Worker 0 times the static path on a spread of the trace (seconds per padded token); that
   fixes the stride (every k-th row, so that a run fits in about half the time left) and the
   time compression (the trace's duration over one run's expected duration).
3. Adaptive run: the controller runs embedded in this process (a daemon thread, the same loop
   as `gearshift serve`) with the policy's windows and intervals divided by the compression;
   every worker connects, registers the profile and replays its share; then the controller
   stops.
4. Static run: the same workers replay the same shares on the power-of-two gears.

A run's wall time is from the first worker's start to the last one's end, captures included;
its CPU time is the workers' (all their threads) plus this process's (the embedded controller,
in the adaptive run), so `cpu_speedup` compares the work each run cost even when other
processes share the machine.
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
import signal
import tempfile
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from gearshift import protocol
from gearshift.config import PolicyConfig
from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller, EmbeddedController
from gearshift.demo.workload import PROFILE, Workload, stride_for
from gearshift.dims import Gears
from gearshift.errors import GearshiftError
from gearshift.shm import SnapshotRegion, cleanup

log = logging.getLogger(__name__)
READY_TIMEOUT = 300.0  # seconds for N workers to import torch on a loaded machine
POLL_SECONDS = 0.02
REPORT_SECONDS = 0.5
EXIT_TIMEOUT = 5.0
RUN_SHARE = 0.45  # of the time left after start-up, for the static run (the adaptive is faster)


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


def _worker(conn: Connection, progress: Any, index: int) -> None:
    from gearshift.demo import worker  # torch is imported in the workers only

    worker.main(conn, progress, index)


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
            per_token = self._ask(every, "calibrate", self.full.dims, self.full.sizes)
            left = self.seconds - (time.monotonic() - began)
            budget = max(1.0, left * RUN_SHARE)
            # all timed at once, so the machine's seconds per token are their mean over N
            stride = stride_for(self.full, sum(per_token) / self.workers**2, budget)
            workload = self.full.every(stride)
            factor = workload.duration / budget
            config = ControllerConfig(namespace=self.namespace, state_dir=state_dir)
            self.controller = Controller.start_embedded(config, self.policy.scaled(factor))
            adaptive = self._run("adaptive", workload)
            self._stop_controller()
            static = self._run("static", workload)
        return {
            "trace": workload.trace,
            "workers": self.workers,
            "rows": workload.rows,
            "stride": workload.stride,
            "requests": workload.events,
            "time_compression": factor,
            "seconds": time.monotonic() - began,
            "adaptive": adaptive,
            "static": static,
            "speedup": adaptive["useful_tokens_per_second"] / static["useful_tokens_per_second"],
            "cpu_speedup": adaptive["useful_tokens_per_cpu_second"]
            / static["useful_tokens_per_cpu_second"],
        }

    # processes

    def _start(self) -> None:
        for i in range(self.workers):
            ours, theirs = self.ctx.Pipe()
            proc = self.ctx.Process(
                target=_worker,
                args=(theirs, self.progress, i),
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
                replies[i] = value
            if time.monotonic() > deadline:
                raise GearshiftError(f"demo workers timed out during {command}")
            if tick is not None:
                tick()
        return [replies[i] for i in workers]

    # the runs

    def _run(self, name: str, workload: Workload) -> dict[str, Any]:
        gears = {d: dim.initial_gears for d, dim in workload.dims.items()}
        now = began = time.monotonic()
        cpu = time.process_time()
        watch = GearWatch(self.namespace, gears, now) if name == "adaptive" else None
        self.progress[:] = [0] * len(self.progress)
        next_report = now

        def tick() -> None:
            nonlocal next_report
            now = time.monotonic()
            if watch is not None:
                watch.poll(now)
            if now >= next_report:
                next_report = now + REPORT_SECONDS
                self.report(self._progress(name, now - began, workload, watch, gears))

        args = [(workload.dims, workload.share(i, self.workers)) for i in range(self.workers)]
        if name == "adaptive":
            args = [(self.namespace, *a) for a in args]
        for conn, a in zip(self.conns, args, strict=True):
            conn.send((name, *a))
        deadline = began + max(READY_TIMEOUT, 20 * self.seconds)
        try:
            results = self._collect(range(self.workers), name, deadline, tick)
            tick()
            figures = self._figures(results, workload, watch)
            figures["parent_cpu_seconds"] = time.process_time() - cpu
            spent = figures["worker_cpu_seconds"] + figures["parent_cpu_seconds"]
            figures["useful_tokens_per_cpu_second"] = figures["useful_tokens"] / spent
            return figures
        finally:
            if watch is not None:
                watch.close()

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
        self, results: list[dict[str, Any]], workload: Workload, watch: GearWatch | None
    ) -> dict[str, Any]:
        def total(key: str) -> int:
            return sum(r[key] for r in results)

        seconds = max(r["ended"] for r in results) - min(r["began"] for r in results)
        useful = total("useful")
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
            "computed_tokens": total("computed"),
            "worker_cpu_seconds": total("cpu"),
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
