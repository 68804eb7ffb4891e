"""The GPU check of the device path (docs/architecture.md, "Hazards on the device"):
`python -m gearshift.tools.bench.graphs_gpu [STEP ...]`, what `tools/gpu/check.sh` runs from
the repository root on a CUDA machine.

It cannot lose what it measured: each step runs in a process of its own, under its own
timeout, and prints ONE JSON line `{"step": name, "rc": ..., "seconds": ..., ...}` (flushed)
as soon as it ends, whatever it ended by: a step killed by its timeout or by a fault keeps the
last JSON line its process printed (`graphs_gpu_probes.emit`). The steps run in `steps()`
order: the environment, gearshift's probes, the GPU tests, the bench, its 2-worker adoption,
and the raw-torch probes last, each alone, so that a sticky device error (an illegal address
leaves the context unusable) ends only its own process, after everything else has reported.
Every step's timeout is cut to what is left of `BUDGET` seconds, which `tools/gpu/check.sh`'s
outer timeout exceeds by `SPARE`: the outer one never fires while a step runs. Without CUDA it
prints the environment step (`skipped`) and exits 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gearshift.tools.bench.graphs_gpu_probes import RAW, SAFE

GPU_TESTS = ("tests/graphs", "tests/worker/test_adoption.py", "tests/tools/bench/test_graphs.py")
GPU_TESTS_K = "cuda and not fake and not compiled"  # the tests that need a GPU, not the fakes'
BENCH_KEYS = ("errors", "mismatches", "max_abs_error", "capture_seconds_mean",
              "capture_seconds_max", "graph_bytes", "graph_bytes_measured", "graph_bytes_total",
              "memory_returned_ratio", "released_graph_bytes", "memory_returned_bytes",
              "shared_pool_bytes", "latency", "speed", "backend_stats")
BUDGET = 300  # seconds for every step together (an H100: about 4 minutes are used)
SPARE = 40  # tools/gpu/check.sh's outer timeout is BUDGET + SPARE
PROBE = "gearshift.tools.bench.graphs_gpu_probes"


@dataclass(frozen=True)
class Step:
    """One step: `command` (argv), run for at most `seconds`; `keep` reads its stdout."""

    name: str
    command: tuple[str, ...]
    seconds: int
    keep: str = "json"  # "json": its last JSON line; "pytest": its failures and summary


def steps() -> list[Step]:
    py = sys.executable
    probe = {"workspace": 30, "threads": 30, "void": 15}
    out = [Step(n, (py, "-m", PROBE, n), probe[n]) for n in SAFE]
    pytest = (py, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "-k", GPU_TESTS_K)
    out.append(Step("pytest", (*pytest, *GPU_TESTS), 60, "pytest"))
    out.append(Step("bench", (py, "-m", "gearshift", "bench", "graphs", "--device", "cuda",
                              "--json", "--seconds", "6", "--no-adoption"), 70))
    out.append(Step("adoption", (py, "-m", PROBE, "adoption"), 45))
    out += [Step(n, (py, "-m", PROBE, n), 12) for n in RAW]
    return out


def run_step(step: Step, seconds: float) -> dict[str, Any]:
    """Run one step for at most `seconds`: its line (never raises)."""
    began = time.monotonic()
    try:
        r = subprocess.run(step.command, capture_output=True, text=True,
                           timeout=max(seconds, 1))
        rc, stdout, stderr = r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        stderr = _text(e.stderr) + f" [timed out: {seconds:.0f} s]"
        rc, stdout = 124, _text(e.stdout)
    except OSError as e:
        rc, stdout, stderr = 127, "", repr(e)
    line: dict[str, Any] = {"step": step.name, "rc": rc,
                            "seconds": round(time.monotonic() - began, 1)}
    line |= _pytest(stdout) if step.keep == "pytest" else _last_json(stdout)
    if step.name == "bench":  # its figures, not every table's
        line = {k: line[k] for k in ("step", "rc", "seconds", *BENCH_KEYS, "stdout") if k in line}
    if rc:
        line["stderr"] = stderr[-600:]
    return line


def run_steps(todo: Sequence[Step], budget: float = BUDGET) -> int:
    """Each step in turn, its line printed as it ends; the steps that failed (rc != 0)."""
    end, failed = time.monotonic() + budget, 0
    for step in todo:
        left = end - time.monotonic()
        if left < 1:
            _print({"step": step.name, "rc": None, "skipped": "the check's budget is spent"})
            continue
        line = run_step(step, min(step.seconds, left))
        failed += bool(line["rc"])
        _print(line)
    return failed


def environment() -> dict[str, Any]:
    """What the steps run on: torch, the device, the allocator backend, the cuBLAS settings."""
    import os

    import torch

    out: dict[str, Any] = {"step": "environment", "rc": 0, "torch": torch.__version__,
                           "cuda": torch.cuda.is_available(), "python": sys.version.split()[0]}
    if out["cuda"]:
        props = torch.cuda.get_device_properties(0)
        out |= {"gpu": props.name, "capability": f"{props.major}.{props.minor}",
                "memory_bytes": props.total_memory, "cuda_runtime": torch.version.cuda,
                "allocator": torch.cuda.get_allocator_backend()}
    out |= {k: os.environ[k] for k in ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE",
                                       "PYTORCH_CUDA_ALLOC_CONF") if k in os.environ}
    return out


def main(names: Sequence[str] = ()) -> int:
    """The check (the `names` steps only, if given): its lines; the steps that failed."""
    env = environment()
    if not env["cuda"]:
        _print(env | {"skipped": "no CUDA device"})
        return 0
    _print(env)
    todo = [s for s in steps() if not names or s.name in names]
    return run_steps(todo)


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return dict(json.loads(line))
            except ValueError:
                continue
    return {"stdout": text[-300:]}


def _pytest(text: str) -> dict[str, Any]:
    lines = text.splitlines()
    bad = [x[:160] for x in lines if x.startswith(("FAILED", "ERROR"))][:8]
    return {"failures": bad, "summary": lines[-1] if lines else ""}


def _print(line: dict[str, Any]) -> None:
    print(json.dumps(line, default=str), flush=True)


if __name__ == "__main__":
    sys.exit(1 if main(sys.argv[1:]) else 0)
