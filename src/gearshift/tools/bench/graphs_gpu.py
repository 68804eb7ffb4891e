"""The GPU check of the device hazards (docs/architecture.md, "Hazards on the device"): one run
on a CUDA machine, one JSON line. `python -m gearshift.tools.bench.graphs_gpu` (what
`tools/gpu/check.sh` runs from the repository root) runs each probe in its own process (a
voided capture may poison the process's generator and allocator), then the GPU tests and
`gearshift bench graphs --device cuda`.

Probes, each through gearshift's backend (what it must hold) and, where it tells which torch
behaviour this one has, through raw torch beside it (what gearshift designs around):
- `workspace`: graphs of large bf16 GEMMs (split-K workspaces) on the backend's one capture
  stream; releasing one must leave the others' replays equal to eager, after a cuBLAS workspace
  clear and with the freed memory re-taken (`hog`); the device's free memory must rise by what
  the released graph held (`returned_minus_held`, a 2 MiB step tolerated). `raw_*`: the same
  with plain `CUDAGraph`s sharing a warm-up workspace (does this torch's reset free it?).
- `threads`: while this thread captures and resets graphs, another replays, samples on the
  default generator and synchronizes the device, guarded (`outside_capture`, the rule; 0
  errors wanted) and raw (what this torch does without the rule).
- `void`: a capture voided by a device synchronize inside it; afterwards (its graph dropped and
  collected) sampling, pinned host memory, `collect()` and a new capture must work; `stats`
  says whether the backend kept the graph for the pinned-host allocator (`host_pools_left`).
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

PROBES = ("workspace", "threads", "void")
TIMEOUTS = {"probe": 120, "pytest": 180, "bench": 240}
GPU_TESTS = ("tests/graphs", "tests/worker/test_adoption.py", "tests/tools/bench/test_graphs.py")
BENCH_KEYS = ("errors", "mismatches", "max_abs_error", "capture_seconds_mean",
              "capture_seconds_max", "graph_bytes", "graph_bytes_measured", "graph_bytes_total",
              "memory_returned_ratio", "released_graph_bytes", "memory_returned_bytes",
              "shared_pool_bytes", "latency", "speed", "backend_stats", "adoption")


def _run(seconds: int, *cmd: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=seconds)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return subprocess.CompletedProcess(cmd, 124, out, f"timed out after {seconds} s")


def _last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return dict(json.loads(line))
            except ValueError:
                break
    return {"stdout": text[-300:]}


def main() -> dict[str, Any]:
    """Every probe in its own process, the GPU tests, the bench: one dict."""
    import torch

    out: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if not out["cuda"]:
        return out | {"skipped": "no CUDA device"}
    out["gpu"] = torch.cuda.get_device_name(0)
    for probe in PROBES:
        r = _run(TIMEOUTS["probe"], sys.executable, "-m", __name__, probe)
        out[probe] = _last_json(r.stdout) | {"rc": r.returncode}
        if r.returncode:
            out[probe]["err"] = r.stderr[-400:]
    r = _run(TIMEOUTS["pytest"], sys.executable, "-m", "pytest", "-q", "-rfE",
             "-p", "no:cacheprovider", *GPU_TESTS)
    lines = r.stdout.splitlines()
    out["pytest"] = {"rc": r.returncode, "tail": [x[:160] for x in lines
                                                  if x.startswith(("FAILED", "ERROR"))][:8]
                     + lines[-1:]}
    try:
        import posix_ipc  # noqa: F401  (the 2-worker adoption needs it)
        adoption = "--adoption"
    except ImportError:
        adoption, out["adoption_skipped"] = "--no-adoption", "posix_ipc is not installed"
    r = _run(TIMEOUTS["bench"], sys.executable, "-m", "gearshift", "bench", "graphs",
             "--device", "cuda", "--json", "--seconds", "12", adoption)
    bench = _last_json(r.stdout)
    out["bench"] = {k: bench[k] for k in (*BENCH_KEYS, "stdout") if k in bench}
    out["bench"]["rc"] = r.returncode
    if r.returncode:
        out["bench"]["err"] = r.stderr[-600:]
    return out


def _tried(fn: Callable[[], object], sink: list[str]) -> None:
    try:
        fn()
    except Exception as e:
        sink.append(repr(e)[:160])


def probe_workspace() -> dict[str, Any]:
    import torch

    from gearshift.graphs.backends import cuda_backend
    from gearshift.graphs.pool import GraphResourcePool

    backend, out = cuda_backend(0), {}
    w = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) / 90
    xs = {m: torch.randn(m, 8192, device="cuda", dtype=torch.bfloat16) for m in (1, 4, 16, 64)}

    def wrong(graphs: dict[int, Any], replay: Callable[[Any], torch.Tensor]) -> int:
        """Replays (each returns its outputs) unlike eager."""
        bad = 0
        for m, g in graphs.items():
            y = replay(g)
            torch.cuda.current_stream().synchronize()
            bad += not torch.allclose(y, xs[m] @ w, rtol=2e-2, atol=2e-2)
        return bad

    pool = GraphResourcePool(backend)
    graphs = {m: backend.graph(lambda m=m: xs[m] @ w) for m in xs}
    keys = {}
    for m, g in graphs.items():
        g.capture()
        keys[m] = pool.register(g)
    free0, held = backend.mem_get_info()[0], graphs[64].pool_bytes or 0
    gone = graphs.pop(64)
    pool.remove_by_keys([keys[64]])
    del gone
    out["returned_minus_held"] = backend.mem_get_info()[0] - free0 - held
    torch._C._cuda_clearCublasWorkspaces()
    hog = [torch.full((1 << 19,), float("nan"), device="cuda", dtype=torch.bfloat16)
           for _ in range(512)]
    out["survivor_mismatches"] = wrong(graphs, lambda g: (g.replay(), g.outputs)[1])
    del hog
    print(json.dumps(out), flush=True)
    # raw torch: graphs on one stream after shared warm-ups; one reset, the memory re-taken
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
    raw.pop(64)[0].reset()
    torch.cuda.empty_cache()
    hog = [torch.full((1 << 19,), float("nan"), device="cuda", dtype=torch.bfloat16)
           for _ in range(512)]
    errors: list[str] = []
    _tried(lambda: out.__setitem__("raw_survivor_mismatches",
                                   wrong(raw, lambda g: (g[0].replay(), g[1])[1])), errors)
    out["raw_error"] = errors[0] if errors else None
    out["raw_hog_clobbered"] = sum(int((~h.isnan()).sum()) for h in hog)  # written into
    return out


def probe_threads(n: int = 40) -> dict[str, Any]:
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

    def beside(fn: Callable[[], object]) -> dict[str, Any]:
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
            graph = backend.graph(lambda: torch.relu(x @ w))
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

    def alone(fn: Callable[[], object], seconds: float) -> dict[str, Any]:
        lat, errors, end = [], [], time.perf_counter() + seconds
        while time.perf_counter() < end:
            began = time.perf_counter()
            _tried(fn, errors)
            lat.append(time.perf_counter() - began)
        ms = sorted(t * 1e3 for t in lat)
        return {"errors": len(errors), "calls": len(lat), "p50_ms": ms[len(ms) // 2],
                "p99_ms": ms[min(len(ms) - 1, int(len(ms) * 0.99))]}

    sample = lambda: torch.multinomial(torch.rand(8, 1000, device="cuda"), 1)  # noqa: E731
    cases: dict[str, Callable[[], object]] = {
        "replay": replay_checked,
        "sample_guarded": guarded(sample),
        "device_sync_guarded": guarded(torch.cuda.synchronize),
        "raw_sample": sample,
        "raw_replay": lambda: live.graph.replay(),
        "raw_device_sync": torch.cuda.synchronize,
    }
    out: dict[str, Any] = {"replay_alone": alone(replay_checked, 2.0)}  # the same-run baseline
    for name, fn in cases.items():  # the raw ones last: they may poison this process
        out[name] = beside(fn)
        print(json.dumps(out, default=str), flush=True)
    return out


def probe_void() -> dict[str, Any]:
    import torch

    from gearshift.graphs.backends import cuda_backend

    backend, out = cuda_backend(0), {}
    x = torch.ones(1 << 20, device="cuda")

    def syncs() -> torch.Tensor:
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
    out["stats"] = dict(backend.stats)  # host_pools_left: 1 where torch's capture_end
    return out  # ended neither allocator's recording (before pytorch PR #180395)


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else ""
    probes = {"workspace": probe_workspace, "threads": probe_threads, "void": probe_void}
    try:
        result = probes[which]() if which else main()
    except Exception as e:
        result = {"error": repr(e)[:300]}
    print(json.dumps(result, default=str), flush=True)
