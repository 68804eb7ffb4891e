"""What a demo run measures: the `Progress` it reports as it goes, and each arm's figures.

An arm's figures per profile add up its lanes' reports over the slices (`arm.Lane.figures`);
its wall time and CPU time are what `run` measured slice by slice (a slice's wall time is from
the first worker's start to the last one's end, the adaptive arm's captures after it
included), shared among the profiles by what each one's requests took (`split`); model seconds
are each profile's calibrated `Cost` of its padded work. `overall` adds the profiles up. How
the demo measures: docs/tools.md.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gearshift.controller.slots import Lag
from gearshift.tools.demo.watch import GearWatch
from gearshift.tools.demo.workload import Cost, Workload

COMPILE_KEYS = ("compiles", "compile_seconds", "compile_cache_hits", "compile_cache_misses",
                "compile_wait_seconds", "graph_breaks")  # a CompiledRunner's stats


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
    total: int,
    gears: dict[str, int],
    version: int | None,
) -> Progress:
    """The Progress of run `name` from the workers' shared counts: [requests done, useful
    tokens, padded tokens] per worker, one after another, of `total` requests."""
    p = list(counts)
    useful, padded = sum(p[1::3]), sum(p[2::3])
    return Progress(name, seconds, sum(p[0::3]), total,
                    padded / useful - 1.0 if useful else 0.0, gears, version)


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
    peak_rss_mb: float,
) -> dict[str, Any]:
    """One profile's figures in one arm from its lanes' `results` (`arm.Lane.figures`, every
    worker's, every slice's), its share of the arm's wall `seconds` and of the CPU seconds of
    the workers and of the controller (`split`), the gears `watch` saw (None: the static arm's
    initial gears), the controller's propagation `lag` and the workers' peak memory."""

    def total(key: str) -> int:
        return sum(r[key] for r in results)

    useful = total("useful")
    model = cost.seconds(0, total("padded"), total("padded_pairs"))
    useful_model = cost.seconds(0, useful, total("useful_pairs"))
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
        "useful_model_seconds": useful_model,
        "compute_overhead": model / useful_model - 1.0,
        "replayed_tokens": total("computed") - total("capture_tokens"),
        "captured_tokens": total("capture_tokens"),
        "worker_cpu_seconds": worker_cpu,
        "controller_cpu_seconds": controller_cpu,
        "useful_tokens_per_cpu_second": useful / (worker_cpu + controller_cpu),
        "request_cpu_seconds": total("busy_cpu"),
        "model_cpu_seconds": total("model_cpu"),
        "capture_cpu_seconds": total("capture_cpu"),
        "worker_peak_rss_mb": peak_rss_mb,
        "dims": dims,
        "adds": watch.adds if watch else 0,
        "evictions": watch.evictions if watch else 0,
        "captures": total("captures"),
        "replays": total("replays"),
        "eager": total("eager"),
        "priced_adds": watch.priced if watch else 0,
        "priced_reasons": list(watch.priced_reasons) if watch else [],
        "capture_share": total("capture_cpu") / worker_cpu if worker_cpu else 0.0,
        "snapshot_version": watch.version if watch else None,
        "versions_missed": watch.missed if watch else None,
        "propagation_lag": lag,
        **({"compile": compiles} if (compiles := compile_figures(results)) else {}),
    }


def compile_figures(results: list[dict[str, Any]]) -> dict[str, dict[str, float]] | None:
    """A compiled runner's lanes' compiles (`arm.Lane.figures`): before the arm started
    (`startup`: calibration's, the initial gears') and during it (`run`), each `COMPILE_KEYS`
    added up; None for eager runners."""
    if not results or "compiles" not in results[0]:
        return None
    startup = [r["startup"] for r in results if "startup" in r]
    return {"startup": {k: sum(r[k] for r in startup) for k in COMPILE_KEYS},
            "run": {k: sum(r[k] for r in results) for k in COMPILE_KEYS}}


# a lane's figures summed over an instance's ranks
RANK_SUMMED = ("busy_cpu", "model_cpu", "capture_cpu")


def instances(reports: list[dict[str, dict[str, Any]]], ranks: int
              ) -> list[dict[str, dict[str, Any]]]:
    """Workers' lane reports (`arm.Lane.figures` per profile, worker by worker) per instance of
    `ranks` consecutive workers (tensor parallel): its driver's, every rank's CPU seconds
    (RANK_SUMMED) added up, so that an instance's requests count once and its ranks' CPU all."""
    if ranks == 1:
        return reports
    return [{p: {**lane, **{k: sum(r[p][k] for r in reports[at:at + ranks])
                            for k in RANK_SUMMED}}
             for p, lane in reports[at].items()} for at in range(0, len(reports), ranks)]


def lockstep(checks: list[dict[str, Any]]) -> dict[str, Any]:
    """The drivers' lockstep counts (`lockstep.Lockstep.figures`, every slice's) added up:
    steps, steps whose gears differed across ranks, outputs checked against the unsharded
    model, those beyond its tolerance, the worst relative error."""
    out: dict[str, Any] = {k: sum(c[k] for c in checks)
                           for k in ("steps", "differed", "checked", "mismatched")}
    out["worst_error"] = max((c["worst_error"] for c in checks), default=0.0)
    return out


SUMMED = ("requests", "useful_tokens", "padded_tokens", "model_seconds", "useful_model_seconds",
          "replayed_tokens", "captured_tokens", "request_cpu_seconds", "model_cpu_seconds",
          "capture_cpu_seconds", "adds", "evictions", "captures", "replays", "eager",
          "priced_adds")


def overall(profiles: dict[str, dict[str, Any]], seconds: float, worker_cpu: float,
            controller_cpu: float) -> dict[str, Any]:
    """One arm's figures over every profile (`run_figures` of each): counts and model seconds
    added up, the arm's wall and CPU seconds, their ratios; one profile's own figures for one.
    A dim two profiles share is named `profile.dim`."""
    figures = list(profiles.values())
    out = {k: sum(f[k] for f in figures) for k in SUMMED}
    names = [d for f in figures for d in f["dims"]]
    dims = {}
    for p, f in profiles.items():
        dims.update({d if names.count(d) == 1 else f"{p}.{d}": v for d, v in f["dims"].items()})
    useful = out["useful_tokens"]
    versions = [f["snapshot_version"] for f in figures]
    missed = [f["versions_missed"] for f in figures]
    out.update(
        seconds=seconds,
        useful_tokens_per_second=useful / seconds,
        padding_overhead=out["padded_tokens"] / useful - 1.0,
        compute_overhead=out["model_seconds"] / out["useful_model_seconds"] - 1.0,
        worker_cpu_seconds=worker_cpu,
        controller_cpu_seconds=controller_cpu,
        useful_tokens_per_cpu_second=useful / (worker_cpu + controller_cpu),
        worker_peak_rss_mb=max(f["worker_peak_rss_mb"] for f in figures),
        dims=dims,
        snapshot_version=None if None in versions else max(versions),
        versions_missed=None if None in missed else max(missed),
        propagation_lag=figures[0]["propagation_lag"],
        priced_reasons=[r for f in figures for r in f["priced_reasons"]],
        capture_share=out["capture_cpu_seconds"] / worker_cpu if worker_cpu else 0.0,
    )
    if "compile" in figures[0]:
        out["compile"] = {part: {k: sum(f["compile"][part][k] for f in figures)
                                 for k in COMPILE_KEYS} for part in ("startup", "run")}
    return {k: out[k] for k in figures[0]}  # in run_figures' order


def split(wall: float, workers: float, controller: float,
          lanes: dict[str, list[dict[str, Any]]]) -> dict[str, tuple[float, float, float]]:
    """One arm's slice shared among its profiles (`lanes`: each one's `arm.Lane.figures`):
    its wall seconds and the controller's CPU seconds by the wall time of each one's requests
    and captures, the workers' CPU seconds by their CPU time. The controller's go with the
    wall time, not the count of requests: its loop (drains, scans, status) costs it about the
    same each second whether requests come or not, folding a request next to nothing.
    Per profile `(wall, workers, controller)`; they add up to the slice's."""

    def shares(key: str, *more: str) -> dict[str, float]:
        weight = {p: sum(r[k] for r in rs for k in (key, *more)) for p, rs in lanes.items()}
        whole = sum(weight.values())
        return {p: w / whole if whole else 1 / len(weight) for p, w in weight.items()}

    by_wall = shares("busy_seconds", "capture_cpu")
    by_cpu = shares("busy_cpu", "capture_cpu")
    return {p: (wall * by_wall[p], workers * by_cpu[p], controller * by_wall[p]) for p in lanes}


def spreads(seconds: dict[str, list[float]], cpu: dict[str, list[float]]) -> dict[str, Any]:
    """The speedups slice by slice (the same rows for both arms; a slice where an arm spent
    nothing, no ratio): median, min and max."""

    def spread(static: list[float], adaptive: list[float]) -> dict[str, Any]:
        ratios = [s / a for s, a in zip(static, adaptive, strict=True) if s > 0 and a > 0]
        if not ratios:
            return {"median": None, "min": None, "max": None, "slices": []}
        return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
                "slices": ratios}

    return {
        "slices": len(seconds["static"]),
        "speedup_slices": spread(seconds["static"], seconds["adaptive"]),
        "cpu_speedup_slices": spread(cpu["static"], cpu["adaptive"]),
    }
