"""`gearshift bench step`: the whole request path of one step, against a static dispatcher.

One function small enough that overhead dominates (`x * 2 + 1` on a few rows of 16 floats),
one dim B with the same gears in every arm, cpu graphs, decode-like batch sizes 1..32. The
arms, interleaved batch by batch in one run:

- `static`: a plain static dispatcher written as nano-vllm's `run_model` is: one lookup picks
  the graph (`next(b for b in gears if b >= bs)`), the rows are copied in and the padding rows
  zeroed, the graph replayed, its rows sliced out (copied: the next replay rewrites them, as
  gearshift's result is a tensor of its own); `static_compiled` the same over the very
  compiled functions `gs.compile` captured (one per gear);
- `runner_*`: `profile.run(x=x)` on `profile.runner`'s graphs; `compile_*`: `model(x)` through
  `gs.compile` (compile backend "eager": Dynamo's guards and the function, no codegen);
- `*_live`: a live controller (`gearshift serve`, a process of its own, draining the ring) and
  the client's swap thread ticking; `*_quiet`: both stopped meanwhile (the controller by
  SIGSTOP, the swap thread joined), as the static arms run; `*_adopting`: live, and a thread
  re-adopting the snapshot (`Client._refresh(force=True)`: the same gears, a new epoch, its
  routes made again) every ADOPT_SECONDS, far more often than a controller publishes.

`--cold` runs a model's step between any two timed steps (`Between`: the forward of a stack of
small torch modules, whose Python and kernels evict the caches as a decode loop's model does)
and times each step apart, leaving that step out: the path as a serving loop runs it, cold,
where each of its Python calls and its memory touched costs more than in a hot loop.

Per arm and step: wall and CPU microseconds (the process's, every thread: request, swap and
adopting threads) and the request thread's CPU; per gearshift arm its difference to its static
arm, batch by batch, as median and range; then, with no request, the CPU seconds per second of
the swap thread and of the controller process (idle). Times move with the machine's load; so
one step of each path is also counted, which no load moves: the Python calls into gearshift's
modules (`tools/` left out) and the gearshift frames on the stack when the graph replays.
"""

from __future__ import annotations

import functools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click
import torch

from gearshift.clikit import json_option
from gearshift.core.dims import Dim
from gearshift.errors import GearshiftError
from gearshift.shm import cleanup
from gearshift.tools.bench.cli import echo_result
from gearshift.tools.bench.spread import summarise
from gearshift.worker.connecting import connect
from gearshift.worker.session import Client
from gearshift.worker.swap import SwapThread

GEARS = (1, 2, 4, 8, 16, 32)
WIDTH = 16
ADOPT_SECONDS = 0.01
READY_SECONDS = 120.0  # the longest wait for the controller, or for every gear's graph
PROFILES = ("runner", "compile")
CONDITIONS = ("live", "quiet", "adopting")


def fn(x: torch.Tensor) -> torch.Tensor:
    """The benchmark's function: row-wise, so padding rows change no real row."""
    return x * 2.0 + 1.0


class StaticDispatcher:
    """nano-vllm's `run_model` for one batch dim: one graph per gear on the leading rows of
    one static input, picked by one lookup. `graph_fn(b, view)` is what gear b's graph runs."""

    def __init__(self, backend: Any, gears: tuple[int, ...],
                 graph_fn: Callable[[int, torch.Tensor], Callable[[], Any]]) -> None:
        self.gears = gears
        self.x = torch.zeros(gears[-1], WIDTH)
        self.graphs = {}
        for b in reversed(gears):
            graph = backend.graph(graph_fn(b, self.x[:b]))
            graph.capture()
            self.graphs[b] = graph

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        bs = x.shape[0]
        b = next(b for b in self.gears if b >= bs)
        graph = self.graphs[b]
        self.x[:bs].copy_(x)
        self.x[bs:b].zero_()
        graph.replay()
        return graph.outputs[:bs].clone()


class Between:
    """The model's step `--cold` runs between two timed steps: LAYERS blocks of Linear,
    LayerNorm and GELU modules on 8 rows of 64 features (a small decoder's many module calls
    and small kernels), untimed."""

    LAYERS = 24

    def __init__(self) -> None:
        blocks = [torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.LayerNorm(64),
                                      torch.nn.GELU()) for _ in range(self.LAYERS)]
        self.model = torch.nn.Sequential(*blocks).eval()
        self.x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))

    @torch.no_grad()
    def __call__(self) -> None:
        self.model(self.x)


def _cpu_ns(pid: int) -> int:
    """A process's user + system CPU, in ns (`/proc/PID/stat` fields 14 and 15)."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def _thread_cpu_ns(thread: threading.Thread | None) -> int:
    if thread is None or thread.ident is None or not thread.is_alive():
        return 0
    return time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident))


class _Bench:
    """The controller process, the client, its swap thread and the arms (see the module)."""

    def __init__(self, namespace: str, state_dir: str) -> None:
        self.controller = subprocess.Popen(
            [sys.executable, "-m", "gearshift", "serve", "-n", namespace, "--state-dir",
             state_dir, "--log-level", "WARNING", "--set", "check_interval_seconds=100000"],
        )
        self.client = self._connect(namespace)
        self.swap: SwapThread | None = None
        self.adopting = threading.Event()

    def _connect(self, namespace: str) -> Client:
        deadline = time.monotonic() + READY_SECONDS
        while True:
            try:
                return connect(namespace, require_controller=True, background=False,
                               register_timeout=READY_SECONDS)
            except GearshiftError:
                if time.monotonic() > deadline or self.controller.poll() is not None:
                    raise
                time.sleep(0.1)

    def live(self, on: bool) -> None:
        """Start (on) or stop both the controller's loop and the client's swap thread."""
        os.kill(self.controller.pid, signal.SIGCONT if on else signal.SIGSTOP)
        if on and self.swap is None:
            client = self.client
            self.swap = SwapThread(client._tick, lambda: client.poll_interval,
                                   lambda e: None)
            self.swap.start()
        elif not on and self.swap is not None:
            self.swap.stop(READY_SECONDS)
            self.swap = None

    @contextmanager
    def adoptions(self) -> Iterator[None]:
        """A thread re-adopting the snapshot every ADOPT_SECONDS while the block runs."""
        stop = threading.Event()

        def adopt() -> None:
            while not stop.wait(ADOPT_SECONDS):
                self.client._refresh(force=True)

        thread = threading.Thread(target=adopt, name="bench-adopt", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def close(self) -> None:
        self.live(True)
        self.client.close()
        self.controller.send_signal(signal.SIGTERM)
        try:
            self.controller.wait(30)
        except subprocess.TimeoutExpired:
            self.controller.kill()
            self.controller.wait()


def _batch(call: Callable[[torch.Tensor], Any], inputs: list[torch.Tensor],
           between: Between | None = None) -> tuple[float, float, float]:
    """Per step: wall, process CPU, request thread CPU (ns); with `between`, that model's step
    runs before each step, untimed (each step is timed apart)."""
    n = len(inputs)
    if between is None:
        t0, p0, w0 = time.thread_time_ns(), time.process_time_ns(), time.perf_counter_ns()
        for x in inputs:
            call(x)
        w1, p1, t1 = time.perf_counter_ns(), time.process_time_ns(), time.thread_time_ns()
        return (w1 - w0) / n, (p1 - p0) / n, (t1 - t0) / n
    wall = cpu = thread = 0
    for x in inputs:
        between()
        t0, p0, w0 = time.thread_time_ns(), time.process_time_ns(), time.perf_counter_ns()
        call(x)
        w1, p1, t1 = time.perf_counter_ns(), time.process_time_ns(), time.thread_time_ns()
        wall, cpu, thread = wall + w1 - w0, cpu + p1 - p0, thread + t1 - t0
    return wall / n, cpu / n, thread / n


def _calls(call: Callable[[torch.Tensor], Any], x: torch.Tensor) -> tuple[int, int]:
    """One step of `call`: the Python calls into gearshift (its `tools/` left out), and the
    gearshift frames on the stack when the graph replays (the replay's own left out)."""
    calls, frames = 0, []

    def path(code: Any) -> str:
        return code.co_filename.replace(os.sep, "/")

    def ours(code: Any) -> bool:
        name = path(code)
        return "/gearshift/" in name and "/gearshift/tools/" not in name

    def count(frame: Any, event: str, arg: Any) -> None:
        nonlocal calls
        if event != "call" or not ours(frame.f_code):
            return
        calls += 1
        if frame.f_code.co_name == "replay" and not frames:
            up, n = frame.f_back, 0  # up to the bench's own frame (not `gearshift`'s CLI's)
            while up is not None and "/gearshift/tools/" not in path(up.f_code):
                n += ours(up.f_code)
                up = up.f_back
            frames.append(n)

    call(x)
    sys.setprofile(count)
    try:
        call(x)
    finally:
        sys.setprofile(None)
    return calls, frames[0] if frames else 0


def _wait_ready(runners: list[Any], bench: _Bench) -> None:
    deadline = time.monotonic() + READY_SECONDS
    while any(len(r.ready()) < len(GEARS) for r in runners):
        if time.monotonic() > deadline:
            raise GearshiftError(f"the gears' graphs were not captured in {READY_SECONDS} s")
        time.sleep(0.05)


def run(batches: int, batch: int, idle_seconds: float, cold: bool = False) -> dict[str, Any]:
    """The benchmark (see the module); its figures by name."""
    from gearshift.worker.compiling import compile as gs_compile

    torch.set_num_threads(1)
    namespace = f"bench-step-{os.getpid()}"
    dims = {"B": Dim(gears=list(GEARS), max=GEARS[-1])}
    example = {"x": torch.zeros(1, WIDTH)}
    gen = torch.Generator().manual_seed(0)
    sizes = torch.randint(1, GEARS[-1] + 1, (batch,), generator=gen).tolist()
    inputs = [torch.randn(n, WIDTH, generator=gen) for n in sizes]
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-step") as state_dir:
        bench = _Bench(namespace, state_dir)
        try:
            bench.live(True)
            client = bench.client
            prof = client.profile("runner", dims, lazy_start=False)
            runner = prof.runner(fn, {"x": ("B", None)}, example)
            model = gs_compile(fn, dims, {"x": ("B", None)}, example, name="compile",
                               client=client, backend="eager", lazy_start=False,
                               shared_cache=False)
            compiled = model.runner
            _wait_ready([runner, compiled], bench)
            backend = runner.backend
            calls: dict[str, Callable[[torch.Tensor], Any]] = {
                "static": StaticDispatcher(backend, GEARS,
                                           lambda b, v: functools.partial(fn, v)),
                "static_compiled": StaticDispatcher(
                    backend, GEARS,
                    lambda b, v: functools.partial(compiled.compiled((b,)), x=v)),
                "runner": lambda x: prof.run(x=x),
                "compile": model,
            }
            for x in inputs:  # every arm computes the function
                want = fn(x)
                for name, call in calls.items():
                    assert torch.equal(call(x), want), name
            out = _arms(bench, calls, inputs, batches, Between() if cold else None)
            out["cold"] = cold
            for name in ("runner", "compile"):
                n, frames = _calls(calls[name], inputs[0])
                out[f"{name}_gearshift_calls_per_step"] = n
                out[f"{name}_gearshift_frames_at_replay"] = frames
            out.update(_idle(bench, idle_seconds))
            assert runner.stats["eager"] == 0 and compiled.stats["eager"] == 0, \
                "a step ran eagerly: the arms would not compare graphs"
            model.close()
        finally:
            bench.close()
            cleanup(namespace)
    return out


def _arms(bench: _Bench, calls: dict[str, Callable[[torch.Tensor], Any]],
          inputs: list[torch.Tensor], batches: int, between: Between | None) -> dict[str, Any]:
    arms = ["static", "static_compiled",
            *(f"{p}_{c}" for c in CONDITIONS for p in PROFILES)]
    samples: dict[str, list[tuple[float, float, float]]] = {a: [] for a in arms}
    for _ in range(batches):
        bench.live(False)
        for name in ("static", "static_compiled"):
            samples[name].append(_batch(calls[name], inputs, between))
        for p in PROFILES:
            samples[f"{p}_quiet"].append(_batch(calls[p], inputs, between))
        bench.live(True)
        for p in PROFILES:
            samples[f"{p}_live"].append(_batch(calls[p], inputs, between))
        with bench.adoptions():
            for p in PROFILES:
                samples[f"{p}_adopting"].append(_batch(calls[p], inputs, between))
    out: dict[str, Any] = {"steps_per_batch": len(inputs), "batches": batches}
    for arm in arms:
        wall, cpu, thread = zip(*samples[arm], strict=True)
        out[f"{arm}_wall_us"] = statistics.median(wall) / 1e3
        out[f"{arm}_cpu_us"] = statistics.median(cpu) / 1e3
        out[f"{arm}_request_thread_cpu_us"] = statistics.median(thread) / 1e3
    for arm in arms[2:]:
        base = samples["static_compiled" if arm.startswith("compile") else "static"]
        for i, what in ((0, "wall"), (1, "cpu")):
            diffs = [(a[i] - b[i]) / 1e3 for a, b in zip(samples[arm], base, strict=True)]
            summarise(out, f"{arm}_minus_static_{what}_us", diffs)
    return out


def _idle(bench: _Bench, seconds: float) -> dict[str, float]:
    """CPU seconds per second of the swap thread and the controller, with no request."""
    bench.live(True)
    time.sleep(min(seconds, 1.0))  # the first ticks after a batch drain what it recorded
    swap = bench.swap.thread if bench.swap is not None else None
    s0, c0, w0 = _thread_cpu_ns(swap), _cpu_ns(bench.controller.pid), time.monotonic_ns()
    time.sleep(seconds)
    s1, c1, w1 = _thread_cpu_ns(swap), _cpu_ns(bench.controller.pid), time.monotonic_ns()
    return {"idle_swap_thread_cpu_per_s": (s1 - s0) / (w1 - w0),
            "idle_controller_cpu_per_s": (c1 - c0) / (w1 - w0)}


@click.command()
@click.option("--batches", default=30, show_default=True, help="Timed batches per arm.")
@click.option("--batch", default=200, show_default=True, help="Steps per batch.")
@click.option("--idle-seconds", default=5.0, show_default=True,
              help="Seconds the idle swap thread and controller are measured.")
@click.option("--cold", is_flag=True,
              help="Run a model's step between any two timed steps, untimed (cold caches).")
@json_option()
def command(batches: int, batch: int, idle_seconds: float, cold: bool, as_json: bool) -> None:
    """Per step, wall and CPU microseconds of `model(x)` (`gs.compile`) and `profile.run`
    with a live, a stopped and an adopting controller and swap thread, against a static
    dispatcher on the same graphs in the same run; the idle swap thread's and controller's
    CPU per second. --cold: with a model's step between steps, as a serving loop runs them."""
    echo_result(run(batches, batch, idle_seconds, cold), as_json)
