"""`gearshift bench compile`: one new gear compiled by N worker processes at once, sharing the
node's compile cache (gearshift) against each its own (the baseline, same run).

Each worker is a process of its own that builds a `CompiledRunner` of the demo's block model
(`Model.forward`, SEQLEN bound) and, on the parent's word to all at once, captures one gear;
it reports the wall seconds from that word to its graph being ready (a wait for the shape's
lock included), the seconds it waited, its compile's FX graph cache hits and misses, and its
CPU seconds (its own and its children's: the C++ compiler). Arms: `shared` (one Inductor cache
directory and one lock directory for all, as `gs.compile` sets up per namespace) and
`private` (a fresh cache each, no lock: every worker compiles cold, as without gearshift).
Workers are ranked by readiness: the first is the one that compiled; the others' figure is
the median of ranks 2..N. The private arm runs first, so no cache is warm for it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from gearshift.clikit import json_option
from gearshift.graphs import Transform
from gearshift.tools.bench.cli import echo_result

WORKER = "from gearshift.tools.bench.compiling import worker; worker()"
TIMEOUT = 600.0


def worker() -> None:
    """A worker process: argv gear, lock dir ('' for none); TORCHINDUCTOR_CACHE_DIR set by the
    parent. Prints `ready`, waits for a line on stdin, captures, prints one JSON line."""
    import resource

    import torch

    import gearshift as gs
    from gearshift.graphs.backends import CpuBackend
    from gearshift.graphs.pool import GraphResourcePool
    from gearshift.graphs.torchcompile import CompiledRunner
    from gearshift.tools.demo.block import Model
    from gearshift.tools.demo.workload import WIDTH

    gear, lock_dir = int(sys.argv[1]), sys.argv[2] or None
    model = Model()
    dims = {"SEQLEN": gs.Dim(gears=[gear], max=gear)}
    transform = Transform(model.forward, dims, {"x": ("S", None)}, outputs=("S", None))
    runner = CompiledRunner(transform, {"x": torch.zeros(1, WIDTH)},
                            pool=GraphResourcePool(CpuBackend()), lock_dir=lock_dir)
    print("ready", flush=True)
    sys.stdin.readline()
    began = time.monotonic()
    runner.capture([{"SEQLEN": gear}])
    seconds = time.monotonic() - began
    usage = [resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    (c,) = runner.compiles
    print(json.dumps({"seconds": seconds, "waited": c.waited, "compile": c.seconds,
                      "hits": c.cache_hits, "misses": c.cache_misses,
                      "cpu": sum(u.ru_utime + u.ru_stime for u in usage)}), flush=True)


def _arm(workers: int, gear: int, root: Path, shared: bool) -> list[dict[str, Any]]:
    """N workers started together; their reports, first ready first."""
    procs = []
    (root / "locks").mkdir(mode=0o700, parents=True)
    for i in range(workers):
        cache = root / ("cache" if shared else f"cache{i}")
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)}
        lock = str(root / "locks") if shared else ""
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER, str(gear), lock], env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        reports = []
        for p in procs:
            out, _ = p.communicate(timeout=TIMEOUT)
            if p.returncode != 0:
                raise click.ClickException(f"a worker failed (exit status {p.returncode})")
            reports.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return sorted(reports, key=lambda r: r["seconds"])


def _figures(reports: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    rest = [r["seconds"] for r in reports[1:]]
    return {
        f"{prefix}_first_seconds": reports[0]["seconds"],
        f"{prefix}_others_seconds": statistics.median(rest) if rest else 0.0,
        f"{prefix}_others_seconds_range": [min(rest), max(rest)] if rest else [0.0, 0.0],
        f"{prefix}_cpu_seconds": sum(r["cpu"] for r in reports),
        f"{prefix}_cache_hits": sum(r["hits"] for r in reports),
        f"{prefix}_cache_misses": sum(r["misses"] for r in reports),
        f"{prefix}_waited_seconds": sum(r["waited"] for r in reports),
    }


@click.command("compile")
@click.option("--workers", default=4, show_default=True, type=click.IntRange(2, 16))
@click.option("--gear", default=512, show_default=True, type=click.IntRange(1, 1 << 16),
              help="The new gear (SEQLEN) every worker compiles.")
@json_option()
def command(workers: int, gear: int, as_json: bool) -> None:
    """N workers compile one new gear at once: a shared cache and per-shape lock against a
    cold cache each (same run)."""
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-compile-") as tmp:
        private = _arm(workers, gear, Path(tmp) / "private", shared=False)
        shared = _arm(workers, gear, Path(tmp) / "shared", shared=True)
    result = {"workers": workers, "gear": gear, **_figures(shared, "shared"),
              **_figures(private, "private")}
    result["cpu_ratio"] = result["private_cpu_seconds"] / max(result["shared_cpu_seconds"], 1e-9)
    echo_result(result, as_json)
