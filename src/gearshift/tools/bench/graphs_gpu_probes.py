"""The GPU check's probes (`graphs_gpu` runs each in a process of its own): what gearshift must
hold on a CUDA device, and what raw torch does without its rules (docs/architecture.md,
"Hazards on the device"). `python -m gearshift.tools.bench.graphs_gpu_probes NAME` prints a
JSON line after each part, so that a probe killed or faulted midway still leaves what it had.

Through gearshift's backend (none may fail):
- `workspace`: graphs of large bf16 GEMMs (split-K workspaces) on the backend's capture
  stream; releasing one must leave the others' replays equal to eager, after a process-wide
  cuBLAS workspace clear (a third party's: Inductor's `clear_cublas_manager`) and with the
  freed memory re-taken (`hog`); the device's free memory must rise by what the released
  graph held (`returned_minus_held`, a 2 MiB step tolerated); `graph_bytes`: each graph's
  pool, `graph_free_bytes`: the device's free memory it took.
- `threads`: while this thread captures and resets graphs, another replays, samples on the
  default generator and synchronizes the device, each inside `outside_capture()` (0 errors).
- `void`: a capture voided by a device synchronize inside it; afterwards (its graph dropped
  and collected) sampling, pinned host memory, `collect()` and a new capture must work.
- `adoption`: two worker processes adopting a controller's versions (`graphs_adoption`).

Raw torch, run last (a sticky device error ends only its own process):
- `raw_workspace`: plain `CUDAGraph`s sharing a warm-up workspace; one reset, the memory
  re-taken: does this torch's reset free the stream's workspace under the survivors?
- `raw_threads`: sampling, replays and device synchronizes beside captures, unguarded.
- `raw_rng`: a default-generator increment on another thread during a capture (torch before
  2.13 raises "Offset increment outside graph capture"; 2.13 keys the states by capture id).
- `raw_empty_cache`: `empty_cache()` on another thread's stream during a capture (which
  allocator rule this torch has: asserts, skips, or gates on the caller's stream).
"""

from __future__ import annotations

import gc
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

SAFE = ("workspace", "threads", "void")  # before the tests and the bench; "adoption" after
RAW = ("raw_workspace", "raw_threads", "raw_rng", "raw_empty_cache")


def emit(out: dict[str, Any]) -> None:
    """One JSON line of what the probe has so far (the harness keeps the last one)."""
    print(json.dumps(out, default=str), flush=True)


def _tried(fn: Callable[[], object], sink: list[str]) -> None:
    try:
        fn()
    except Exception as e:
        sink.append(repr(e)[:160])


def _gemms() -> tuple[Any, dict[int, Any]]:
    import torch

    w = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) / 90
    return w, {m: torch.randn(m, 8192, device="cuda", dtype=torch.bfloat16) for m in (1, 4, 16, 64)}


def _wrong(xs: dict[int, Any], w: Any, graphs: dict[int, Any],
           replay: Callable[[Any], Any]) -> int:
    """Replays (each returns its outputs) unlike eager."""
    import torch

    bad = 0
    for m, g in graphs.items():
        y = replay(g)
        torch.cuda.current_stream().synchronize()
        bad += not torch.allclose(y, xs[m] @ w, rtol=2e-2, atol=2e-2)
    return bad


def _hog() -> list[Any]:
    import torch

    return [torch.full((1 << 19,), float("nan"), device="cuda", dtype=torch.bfloat16)
            for _ in range(512)]


def probe_workspace() -> dict[str, Any]:
    import torch

    from gearshift.graphs.backends import cuda_backend
    from gearshift.graphs.pool import GraphResourcePool

    backend, out = cuda_backend(0), {}
    out["workspace_design"] = getattr(getattr(backend, "workspaces", None), "design", None)
    w, xs = _gemms()
    xs[1] @ w  # the caller's eager GEMM: lasting state (its workspace), no graph's
    pool = GraphResourcePool(backend)
    graphs = {m: backend.graph(lambda m=m: xs[m] @ w) for m in xs}
    keys, took = {}, {}
    for m, g in graphs.items():
        free0 = _free(backend)
        g.capture()
        took[m] = free0 - _free(backend)
        keys[m] = pool.register(g)
    out["graph_bytes"] = {m: g.pool_bytes for m, g in graphs.items()}
    out["graph_free_bytes"] = took
    emit(out)
    free0, held = backend.mem_get_info()[0], took[64]
    gone = graphs.pop(64)
    pool.remove_by_keys([keys[64]])
    del gone
    out["returned_minus_held"] = backend.mem_get_info()[0] - free0 - held
    torch._C._cuda_clearCublasWorkspaces()  # a third party's clear
    torch.cuda.empty_cache()
    hog = _hog()
    out["survivor_mismatches"] = _wrong(xs, w, graphs, lambda g: (g.replay(), g.outputs)[1])
    del hog
    out["backend_stats"] = dict(backend.stats)
    return out


def _free(backend: Any) -> int:
    backend.collect()
    return backend.mem_get_info()[0]


def probe_raw_workspace() -> dict[str, Any]:
    """Graphs on one stream after shared warm-ups; one reset, the memory re-taken."""
    import torch

    out: dict[str, Any] = {}
    w, xs = _gemms()
    stream, raw = torch.cuda.Stream(), {}
    with torch.cuda.stream(stream):
        for m in (1, 4, 16, 64):
            xs[m] @ w  # the warm-up: the stream's lasting workspace
            g = torch.cuda.CUDAGraph()
            g.capture_begin(pool=torch.cuda.graph_pool_handle())
            y = xs[m] @ w
            g.capture_end()
            raw[m] = (g, y)
    torch.cuda.synchronize()
    emit(out | {"captured": len(raw)})
    raw.pop(64)[0].reset()
    torch.cuda.empty_cache()
    hog = _hog()
    errors: list[str] = []
    _tried(lambda: out.__setitem__("raw_survivor_mismatches",
                                   _wrong(xs, w, raw, lambda g: (g[0].replay(), g[1])[1])),
           errors)
    out["raw_error"] = errors[0] if errors else None
    emit(out)
    out["raw_hog_clobbered"] = sum(int((~h.isnan()).sum()) for h in hog)  # written into
    return out


def _beside(backend: Any, fn: Callable[[], object], body: Callable[[], Any],
            n: int) -> dict[str, Any]:
    """`fn` in a loop on another thread while this one captures and resets `n` graphs."""
    stop, errors, failures, lat = threading.Event(), [], [], []

    def loop() -> None:
        while not stop.is_set():
            began = time.perf_counter()
            _tried(fn, errors)
            lat.append(time.perf_counter() - began)

    thread = threading.Thread(target=loop)
    thread.start()
    began = time.perf_counter()
    for _ in range(n):
        graph = backend.graph(body)
        _tried(graph.capture, failures)
        graph.reset()
    seconds = time.perf_counter() - began
    stop.set()
    thread.join()
    backend.collect()
    ms = sorted(t * 1e3 for t in lat) or [float("nan")]
    return {"capture_failures": len(failures), "other_thread_errors": len(errors),
            "calls": len(lat), "p50_ms": ms[len(ms) // 2],
            "p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))],
            "captures_per_s": n / seconds, "first": (failures + errors)[:2]}


def _threads(raw: bool, n: int = 40) -> dict[str, Any]:
    import torch

    from gearshift.graphs.backends import cuda_backend
    from gearshift.graphs.device import outside_capture

    backend = cuda_backend(0)
    w = torch.randn(4096, 4096, device="cuda") / 64
    x = torch.randn(64, 4096, device="cuda")
    live = backend.graph(lambda: torch.relu(x @ w))
    live.capture()

    def replay_checked() -> None:
        live.replay()
        torch.cuda.current_stream().synchronize()
        if not torch.allclose(live.outputs, torch.relu(x @ w), rtol=1e-3, atol=1e-3):
            raise AssertionError("a replay beside a capture differs from eager")

    def guarded(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            with outside_capture():
                return fn()
        return run

    sample = lambda: torch.multinomial(torch.rand(8, 1000, device="cuda"), 1)  # noqa: E731
    cases: dict[str, Callable[[], object]] = (
        {"raw_sample": sample, "raw_replay": lambda: live.graph.replay(),
         "raw_device_sync": torch.cuda.synchronize} if raw else
        {"replay": replay_checked, "sample_guarded": guarded(sample),
         "device_sync_guarded": guarded(torch.cuda.synchronize)})
    out: dict[str, Any] = {}
    if not raw:  # the same-run baseline
        out["replay_alone"] = _alone(replay_checked, 2.0)
    for name, fn in cases.items():
        out[name] = _beside(backend, fn, lambda: torch.relu(x @ w), n)
        emit(out)
    return out


def _alone(fn: Callable[[], object], seconds: float) -> dict[str, Any]:
    lat: list[float] = []
    errors: list[str] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        began = time.perf_counter()
        _tried(fn, errors)
        lat.append(time.perf_counter() - began)
    ms = sorted(t * 1e3 for t in lat)
    return {"errors": len(errors), "calls": len(lat), "p50_ms": ms[len(ms) // 2],
            "p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))]}


def probe_void() -> dict[str, Any]:
    import torch

    from gearshift.graphs.backends import cuda_backend

    backend, out = cuda_backend(0), {}
    x = torch.ones(1 << 20, device="cuda")

    def syncs() -> Any:
        y = x * 2
        if torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()
        return y

    checks: dict[str, Callable[[], object]] = {
        "forced_void": lambda: backend.graph(syncs).capture(),
        "rng_after_void": lambda: torch.randn(8, device="cuda"),
        "gc_after_void": gc.collect,  # the voided graph is freed unless gearshift keeps it
        "pinned_after_void": lambda: torch.empty(1 << 20, pin_memory=True),
        "collect_after_void": lambda: backend.collect() or 1 / 0,
        "capture_after_void": lambda: backend.graph(lambda: x * 3).capture(),
    }
    for name, fn in checks.items():
        errors: list[str] = []
        _tried(fn, errors)
        out[name] = errors[0] if errors else "ok"
        emit(out)
    out["stats"] = dict(backend.stats)  # host_pools_left: 1 where torch's capture_end
    return out  # ended neither allocator's recording (before pytorch PR #180395)


def _during_capture(other: Callable[[], object]) -> dict[str, Any]:
    """`other()` on another thread while this one has a raw capture underway
    (thread_local mode), then the capture's end: what each raised, or "ok"."""
    import torch

    x, stream, graph = torch.ones(1024, device="cuda"), torch.cuda.Stream(), torch.cuda.CUDAGraph()
    seen: list[str] = []
    with torch.cuda.stream(stream):
        graph.capture_begin(pool=torch.cuda.graph_pool_handle(),
                            capture_error_mode="thread_local")
        x * 2
        thread = threading.Thread(target=lambda: _tried(other, seen))
        thread.start()
        thread.join()
        ended: list[str] = []
        _tried(graph.capture_end, ended)
    return {"other_thread": seen[0] if seen else "ok", "capture_end": ended[0] if ended else "ok"}


def probe_raw_rng() -> dict[str, Any]:
    import torch

    out = _during_capture(lambda: torch.randn(8, device="cuda"))
    errors: list[str] = []
    _tried(lambda: torch.randn(8, device="cuda"), errors)
    return out | {"rng_after": errors[0] if errors else "ok"}


def probe_raw_empty_cache() -> dict[str, Any]:
    import torch

    def other() -> None:
        with torch.cuda.stream(torch.cuda.Stream()):
            torch.cuda.empty_cache()

    return _during_capture(other)


def probe_adoption() -> dict[str, Any]:
    """`gearshift bench graphs`' 2-worker adoption on the device (its short form), apart from
    the bench so that either's timeout loses only its own figures."""
    try:
        import posix_ipc  # noqa: F401
    except ImportError:
        return {"skipped": "posix_ipc is not installed (tools/gpu/check.sh: .whl/)"}
    from gearshift.tools.bench.graphs import SIZES
    from gearshift.tools.bench.graphs_adoption import adoption

    return {"adoption": adoption("cuda", SIZES["device"], quick=True)}


PROBES: dict[str, Callable[[], dict[str, Any]]] = {
    "workspace": probe_workspace, "threads": lambda: _threads(raw=False), "void": probe_void,
    "adoption": probe_adoption,
    "raw_workspace": probe_raw_workspace, "raw_threads": lambda: _threads(raw=True),
    "raw_rng": probe_raw_rng, "raw_empty_cache": probe_raw_empty_cache,
}

if __name__ == "__main__":
    try:
        result = PROBES[sys.argv[1]]()
    except Exception as e:
        result = {"error": repr(e)[:300]}
    emit(result)
