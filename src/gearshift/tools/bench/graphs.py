"""`gearshift bench graphs`: the adaptive runner's graphs of a small transformer on one device,
against eager runs of the same model in the same run; `--device cuda` is the GPU check.

The model (`graphs_model`): pre-norm transformer blocks, width 1024 x 4 layers on a device,
64 x 2 on the cpu (`--quick`: at most 256 x 2); gears BATCHSIZE 1..64 (splittable) x SEQLEN 1,
16, 64: 21 graphs, a pool each.

- Correctness: every gear combination at a raw size one under its gears (padding on both dims)
  against the eager model on the unpadded input, within TOLERANCE (float32; a padded matmul may
  take another kernel, so not bit for bit).
- Speed: `AdaptiveRunner.run` (pad, replay, cut) against the eager model per call, at decode
  sizes (SEQLEN 1, B in DECODE); the device synchronised at the end of each timed loop.
- Capture: seconds per graph (warm-up runs included) and bytes per graph (the drop of
  `mem_get_info` over its capture, the allocator's cache emptied before and after; and what
  the runner measured, `graph_bytes_measured`: its pool; its inputs, views of the runner's
  static buffers, are no graph's). Baseline: the same graphs captured into one shared pool (the
  engines' design), its total.
- Memory returned: `mem_get_info` after releasing half the BATCHSIZE gears, against the bytes
  those graphs held; the baseline's shared pool returns what it returns (nothing, while one of
  its graphs lives).
- Latency: requests (each waits for its own stream, never the device, and samples on the
  default generator inside `outside_capture()`, as a serving worker must) for half of
  `--seconds` idle, then half while another thread captures and releases other gears' graphs
  in a loop (`EXTRA`): p50, p99, errors (an exception, or an output unlike eager's, checked
  every CHECK_EVERY requests).
- Adoption (`graphs_adoption`): two worker processes on the device under a controller.

On the cpu backend memory figures are None (no device memory: graphs re-run on tensors).
"""

from __future__ import annotations

import json
import math
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import click
import torch

from gearshift.clikit import json_option
from gearshift.graphs.adaptive import AdaptiveRunner
from gearshift.graphs.backends import Backend, backend_for
from gearshift.graphs.device import DeviceBackend, outside_capture
from gearshift.graphs.pool import GraphResourcePool
from gearshift.graphs.transform import Transform
from gearshift.tools.bench.graphs_adoption import adoption as two_workers
from gearshift.tools.bench.graphs_model import BATCH, SEQ, TOLERANCE, Model, dims

DECODE = (1, 4, 16, 64)  # decode batches timed for the speedup
RELEASED = (2, 8, 32)  # the half of BATCH released for the memory figure
EXTRA = (3, 6, 12, 24, 48)  # batch gears captured and released beside the latency requests
REQUESTS = (1, 3, 8, 13, 30, 64)  # decode batches of the latency requests, in turn
CHECK_EVERY = 50
SIZES = {"cpu": (64, 2, 4), "device": (1024, 4, 16)}  # width, layers, heads


class SharedPool(DeviceBackend):
    """The baseline: every graph captured into one pool, as the engines capture theirs."""

    def __init__(self, base: DeviceBackend) -> None:
        super().__init__(base.api, base.index, base.warmup)
        self.stream, self.warm_stream = base.stream, base.warm_stream
        self.order, self.workspaces = base.order, base.workspaces  # the same kept workspaces
        self._pool: Any = None

    def new_pool(self) -> Any:
        if self._pool is None:
            self._pool = super().new_pool()
        return self._pool


def make_runner(model: Model, backend: Backend, device: str) -> AdaptiveRunner:
    transform = Transform(model, dims(), {"x": ("B", "S", None)}, outputs=("B", "S", None))
    example = {"x": torch.zeros(1, 1, model.width, device=device)}
    return AdaptiveRunner(transform, example, pool=GraphResourcePool(backend))


def variants(batch: tuple[int, ...] = BATCH) -> list[dict[str, int]]:
    """Largest first (the buffers are sized by the first)."""
    return [{"BATCHSIZE": b, "SEQLEN": s} for b in reversed(batch) for s in reversed(SEQ)]


class Probe:
    """Timing and memory of one backend: `free()` empties the cache first (None on cpu)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.memory = isinstance(backend, DeviceBackend)

    def free(self) -> int | None:
        if not self.memory:
            return None
        self.backend.synchronize()
        self.backend.collect()
        return self.backend.mem_get_info()[0]

    def wait(self) -> None:
        """The caller's stream done (a device synchronize would void a capture beside it)."""
        if self.memory:
            self.backend.stream_synchronize()

    def timed(self, call: Callable[[], object], n: int) -> float:
        """Seconds per call of `n` calls, the device synchronised before and after."""
        self.backend.synchronize()
        began = time.perf_counter()
        for _ in range(n):
            call()
        self.backend.synchronize()
        return (time.perf_counter() - began) / n


def capture_all(runner: AdaptiveRunner, probe: Probe) -> dict[tuple[int, int], tuple[float, Any]]:
    """Per variant: (capture seconds, bytes held or None). A first capture, released, makes the
    process's lasting state (cuBLAS handles and the backend's kept workspaces, kernels loaded),
    which is no graph's memory; in the "per_graph" workspace design each graph's cuBLAS
    workspace is in its own pool, so in its bytes."""
    runner.capture([{"BATCHSIZE": BATCH[0], "SEQLEN": SEQ[0]}])
    runner.release("BATCHSIZE", BATCH[0])
    out = {}
    for v in variants():
        before = probe.free()
        began = time.perf_counter()
        runner.capture([v])
        probe.backend.synchronize()
        seconds = time.perf_counter() - began
        after = probe.free()
        out[v["BATCHSIZE"], v["SEQLEN"]] = (seconds, None if after is None else before - after)
    return out


def correctness(runner: AdaptiveRunner, model: Model, device: str) -> dict[str, Any]:
    """Every graph at the smallest raw size it serves (one over the gear below: padded)."""
    worst, mismatches, eager = 0.0, 0, runner.stats["eager"]
    for v in variants():
        b, s = (_smallest(g, gears) for g, gears in ((v["BATCHSIZE"], BATCH), (v["SEQLEN"], SEQ)))
        x = torch.randn(b, s, model.width, device=device)
        got, want = runner.run({"x": x}), model(x)
        worst = max(worst, float((got - want).abs().max()))
        mismatches += not torch.allclose(got, want, **TOLERANCE)
    assert runner.stats["eager"] == eager, "a gear ran eagerly: its graph is missing"
    return {"max_abs_error": worst, "mismatches": mismatches, "checked": len(variants())}


def _smallest(gear: int, gears: tuple[int, ...]) -> int:
    i = gears.index(gear)
    return gears[i - 1] + 1 if i else gear


def speed(runner: AdaptiveRunner, model: Model, probe: Probe, device: str,
          seconds: float) -> dict[str, Any]:
    """Medians of 3 interleaved rounds, each about `seconds` per design and batch."""
    out: dict[str, Any] = {}
    for b in DECODE:
        x = torch.randn(b, 1, model.width, device=device)
        one = probe.timed(lambda x=x: model(x), 3)
        n = max(3, int(seconds / max(one, 1e-6)))
        eager, graph = [], []
        for _ in range(3):
            eager.append(probe.timed(lambda x=x: model(x), n))
            graph.append(probe.timed(lambda x=x: runner.run({"x": x}), n))
        out[str(b)] = {
            "eager_us": statistics.median(eager) * 1e6,
            "graph_us": statistics.median(graph) * 1e6,
        }
        out[str(b)]["speedup"] = out[str(b)]["eager_us"] / out[str(b)]["graph_us"]
    return out


def requests(runner: AdaptiveRunner, model: Model, probe: Probe,
             inputs: Mapping[int, torch.Tensor], seconds: float) -> dict[str, Any]:
    latencies, errors, wrong, n = [], 0, 0, 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        x = inputs[REQUESTS[n % len(REQUESTS)]]
        n += 1
        began = time.perf_counter()
        try:
            y = runner.run({"x": x})
            with outside_capture():  # the sampling a serving worker does on this thread
                torch.multinomial(torch.softmax(y[:, -1, :16].float(), -1), 1)
            probe.wait()
        except Exception:
            errors += 1
            continue
        latencies.append(time.perf_counter() - began)
        if n % CHECK_EVERY == 0 and not torch.allclose(y, model(x), **TOLERANCE):
            wrong += 1
    ms = sorted(t * 1e3 for t in latencies) or [math.nan]
    return {
        "requests": len(latencies), "errors": errors, "wrong": wrong,
        "p50_ms": ms[len(ms) // 2], "p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
    }


def latency(runner: AdaptiveRunner, model: Model, probe: Probe, device: str,
            seconds: float) -> dict[str, Any]:
    inputs = {b: torch.randn(b, 1, model.width, device=device) for b in REQUESTS}  # no capture
    idle = requests(runner, model, probe, inputs, seconds / 2)
    stop, churn = threading.Event(), {"captures": 0, "releases": 0, "errors": 0}

    def capture_and_release() -> None:
        while not stop.is_set():
            for v in variants(EXTRA):
                if stop.is_set():
                    break
                try:
                    churn["captures"] += runner.capture([v])
                except Exception:
                    churn["errors"] += 1
            for b in EXTRA:
                churn["releases"] += runner.release("BATCHSIZE", b)

    thread = threading.Thread(target=capture_and_release, name="bench-capture", daemon=True)
    thread.start()
    busy = requests(runner, model, probe, inputs, seconds / 2)
    stop.set()
    thread.join()
    for b in EXTRA:
        runner.release("BATCHSIZE", b)
    return {"idle": idle, "capturing": busy, **{f"churn_{k}": v for k, v in churn.items()}}


def memory(runner: AdaptiveRunner, probe: Probe,
           held: Mapping[tuple[int, int], tuple[float, Any]]) -> dict[str, Any]:
    """Release RELEASED's graphs: what came back against what they held."""
    if not probe.memory:
        return {"released_graphs": sum(runner.release("BATCHSIZE", b) for b in RELEASED)}
    before = probe.free()
    released = sum(runner.release("BATCHSIZE", b) for b in RELEASED)
    returned = probe.backend.mem_get_info()[0] - before  # the releases collected
    expected = sum(n for (b, _), (_, n) in held.items() if b in RELEASED)
    return {
        "released_graphs": released, "released_graph_bytes": expected,
        "memory_returned_bytes": returned, "memory_returned_ratio": returned / max(expected, 1),
    }


def shared_pool(model: Model, backend: DeviceBackend, device: str) -> dict[str, Any]:
    """The baseline's bytes for the same graphs in one pool, and what releasing half returns."""
    shared = SharedPool(backend)
    probe = Probe(shared)
    runner = make_runner(model, shared, device)
    before = probe.free()
    runner.capture(variants())
    after = probe.free()
    for b in RELEASED:
        runner.release("BATCHSIZE", b)
    returned = probe.free() - after
    for b in BATCH:
        runner.release("BATCHSIZE", b)
    return {"shared_pool_bytes": before - after, "shared_pool_returned_bytes": returned}


def run(device: str, seconds: float, quick: bool, adoption: bool) -> dict[str, Any]:
    """Every figure (see the module) on `device`."""
    backend = backend_for(device)
    width, layers, heads = SIZES["cpu" if backend.kind == "cpu" else "device"]
    if quick:
        width, layers = min(width, 256), min(layers, 2)
    model, probe = Model(width, layers, heads, device), Probe(backend)
    runner = make_runner(model, backend, device)
    held = capture_all(runner, probe)
    captures = [t for t, _ in held.values()]
    graph_bytes = [n for _, n in held.values() if n is not None]
    result: dict[str, Any] = {
        "device": device, "kind": backend.kind, "model": {"width": width, "layers": layers,
                                                          "heads": heads},
        "gears": {"BATCHSIZE": list(BATCH), "SEQLEN": list(SEQ)}, "graphs": len(held),
        "tolerance": TOLERANCE, "torch": torch.__version__,
        "capture_seconds_mean": statistics.mean(captures),
        "capture_seconds_max": max(captures),
        "graph_bytes_mean": statistics.mean(graph_bytes) if graph_bytes else None,
        "graph_bytes_total": sum(graph_bytes) if graph_bytes else None,
        "graph_bytes": {f"{b}x{s}": n for (b, s), (_, n) in held.items()},
        "graph_bytes_measured": {f"{v['BATCHSIZE']}x{v['SEQLEN']}": c.graph_bytes
                                 for v, c in runner.take_measurements()},
        **correctness(runner, model, device),
        "speed": speed(runner, model, probe, device, 0.02 if quick else 0.3),
        "latency": latency(runner, model, probe, device, seconds),
        **memory(runner, probe, held),
    }
    if isinstance(backend, DeviceBackend):
        result |= shared_pool(model, backend, device)
        result["backend_stats"] = dict(backend.stats)
    if adoption:
        result["adoption"] = two_workers(device, (width, layers, heads), quick)
    lat = result["latency"]
    result["errors"] = (
        lat["idle"]["errors"] + lat["idle"]["wrong"] + lat["capturing"]["errors"]
        + lat["capturing"]["wrong"] + lat["churn_errors"] + result["mismatches"]
        + (result["adoption"]["errors"] if adoption else 0)
    )
    return result


@click.command()
@click.option("--device", default="auto", show_default=True,
              help="cpu, cuda[:N], npu[:N], or auto (cuda when there is one, else cpu).")
@click.option("--seconds", default=60.0, show_default=True,
              help="The latency phase: half idle, half beside captures (--quick: 4).")
@click.option("--quick", is_flag=True, help="Smaller model, shorter timings (a CI check).")
@click.option("--adoption/--no-adoption", default=True, show_default=True,
              help="Also run the 2-worker adoption path on the device.")
@json_option()
def command(device: str, seconds: float, quick: bool, adoption: bool, as_json: bool) -> None:
    """Graphs of a small transformer against its eager runs: outputs, speed, capture time and
    bytes, memory returned by releases, latency beside captures, 2-worker adoption."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if quick and seconds == 60.0:
        seconds = 4.0
    result = run(device, seconds, quick, adoption)
    click.echo(json.dumps(result) if as_json else json.dumps(result, indent=2))
