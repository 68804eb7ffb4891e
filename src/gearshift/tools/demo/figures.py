"""What a demo run measures: the `Progress` it reports as it goes, and each arm's figures.

An arm's figures add up the workers' replies over its slices (`worker.Arm.replay`); its wall
time and CPU time are what `run` measured slice by slice (a slice's wall time is from the first
worker's start to the last one's end, the adaptive arm's captures after it included); model
seconds are the calibrated `Cost` of the padded work. How the demo measures: docs/tools.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gearshift.controller.slots import Lag
from gearshift.core.dims import Gears
from gearshift.tools.demo.watch import GearWatch
from gearshift.tools.demo.workload import Cost, Workload


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


def progress(
    name: str,
    seconds: float,
    counts: Sequence[int],
    workload: Workload,
    watch: GearWatch | None,
    gears: dict[str, Gears],
) -> Progress:
    """The Progress of run `name` from the workers' shared counts: [requests done, useful
    tokens, padded tokens] per worker, one after another."""
    p = list(counts)
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


def propagation_lag(found: Lag | None) -> dict[str, float] | None:
    """The controller's propagation lag on device 0 in milliseconds, None before any."""
    if found is None or not found.count:
        return None
    return {
        "mean_ms": found.seconds_sum / found.count * 1e3,
        "last_ms": (found.last_seconds or 0.0) * 1e3,
        "count": found.count,
    }


def run_figures(
    results: list[dict[str, Any]],
    seconds: float,
    worker_cpu: float,
    controller_cpu: float,
    workload: Workload,
    watch: GearWatch | None,
    cost: Cost,
    lag: dict[str, float] | None,
) -> dict[str, Any]:
    """An arm's figures from the workers' `results` (every slice's), its wall `seconds` and
    the CPU seconds of its workers and of the controller, the gears `watch` saw (None: the
    static arm's initial gears) and the controller's propagation `lag`."""

    def total(key: str) -> int:
        return sum(r[key] for r in results)

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
        "worker_cpu_seconds": worker_cpu,
        "controller_cpu_seconds": controller_cpu,
        "useful_tokens_per_cpu_second": useful / (worker_cpu + controller_cpu),
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
