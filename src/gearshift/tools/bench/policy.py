"""`gearshift bench policy`: folding events into DimStats, and one decision round vs events.

Traffic: one profile, BATCHSIZE (1..256) and SEQLEN (1..8192) log-normal sizes, spread evenly
over the plan window. A round (view + decide, plan mode and rules mode) is timed with N/100,
N/10 and N events in the window. Baseline, measured in the same run: the reference design
ported (`reference`: torch_npu's `_adaptive_gears.py`, its sample lists, its `record_event`
and its whole round, `run_once`), with the same window, at M/10 and M events; its round is
extrapolated linearly to N. Both must give the same per-gear figures on the same events. The
record baseline gets each request's mapped gears and ratios precomputed (the reference's shape
handling makes them): only `record_event` is timed. Every figure is measured in each of
`--runs` runs and reported as median and range (`spread`), ratios run by run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import TypeVar

import click
import numpy as np

from gearshift.clikit import json_option
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim
from gearshift.core.gears import starting_gears
from gearshift.core.policy import decide
from gearshift.core.rules import gear_stats
from gearshift.core.stats import DimStats
from gearshift.tools.bench.cli import echo_result
from gearshift.tools.bench.reference import ReferenceRuntime, request_metadata
from gearshift.tools.bench.spread import paired, summarise

T = TypeVar("T")
DIMS = {"BATCHSIZE": Dim(max=256), "SEQLEN": Dim(max=8192)}
SHAPE = {"BATCHSIZE": (3.0, 1.0), "SEQLEN": (6.0, 1.2)}  # log-normal mean and sigma
ROUND_REPEATS = 5  # a gearshift round is timed this many times per run (the median)


def _timed(fn: Callable[..., T], *args: object, repeat: int = 1) -> tuple[T, float]:
    """The result and the median wall time in ms over `repeat` calls."""
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        out = fn(*args)
        times.append((time.perf_counter() - began) * 1e3)
    return out, statistics.median(times)


def traffic(n: int, window: float) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """`n` events (their times, sorted, and their sizes per dim), seeded, over `window` s."""
    rng = np.random.default_rng(0)
    times = np.sort(rng.uniform(0.0, window, n))
    values = {name: np.clip(rng.lognormal(*SHAPE[name], n), 1, dim.max).astype(np.int64)
              for name, dim in DIMS.items()}
    return times, values


def _every(times: np.ndarray, values: dict[str, np.ndarray],
           step: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Every step-th event: fewer events with the same spread over the window."""
    return times[::step], {k: v[::step] for k, v in values.items()}


def fold(config: PolicyConfig, times: np.ndarray, values: dict[str, np.ndarray],
         batch: int) -> dict[str, DimStats]:
    """The events folded into fresh DimStats per dim, `batch` events a fold call."""
    stats = {name: DimStats(config) for name in DIMS}
    for name, s in stats.items():
        for i in range(0, len(times), batch):
            s.fold(times[i:i + batch], values[name][i:i + batch])
    return stats


def _round(stats: dict[str, DimStats], now: float, config: PolicyConfig) -> object:
    views = {name: s.view(now) for name, s in stats.items()}
    # The history (a longer horizon) of traffic that began a window ago holds the same events.
    history = views if config.policy_mode == "plan" else None
    return decide(DIMS, starting_gears(DIMS, 0.0), views, None, now, config, history)


def _seed_config(window: float) -> PolicyConfig:
    """Rules mode, the reference's rules, on the same window (half-life: half of it, as the
    reference derives it)."""
    return PolicyConfig(policy_mode="rules", window_seconds=window, half_life_seconds=window / 2)


def reference(times: np.ndarray, values: dict[str, np.ndarray],
              window: float) -> tuple[ReferenceRuntime, list[tuple]]:
    """A fresh reference runtime on the initial gears, and its `record_event` calls."""
    gears = {name: list(dim.initial_gears) for name, dim in DIMS.items()}
    runtime = ReferenceRuntime(gears, {"window_seconds": window})
    rows = zip(*(values[name].tolist() for name in DIMS), strict=True)
    calls = [(*request_metadata(gears, dict(zip(DIMS, row, strict=True))), t)
             for row, t in zip(rows, times.tolist(), strict=True)]
    return runtime, calls


def _record(runtime: ReferenceRuntime, calls: list[tuple]) -> None:
    record = runtime.record_event
    for call in calls:
        record(*call)


def check_same(runtime: ReferenceRuntime, stats: dict[str, DimStats], now: float,
               config: PolicyConfig) -> None:
    """Both designs must give the same per-gear sample counts, hit rates and pad and split
    averages on the same events (AssertionError otherwise)."""
    table = runtime.build_stats_snapshot(now)
    for name, dim in DIMS.items():
        total = sum(s["weighted_hits"] for s in table.values() if s["shape_type"] == name)
        for s in gear_stats(dim.initial_gears, stats[name].view(now), dim, config):
            theirs = table[f"{name}:{s.gear}"]
            assert theirs["sample_count"] == s.sample_count, (name, s.gear)
            ref = (theirs["weighted_hits"] / total, theirs["avg_pad_ratio"],
                   theirs["avg_split_ratio"])
            got = (s.hit_rate, s.avg_pad, s.avg_split)
            assert np.allclose(ref, got, rtol=1e-9, atol=1e-12), (name, s.gear, ref, got)


def _at(n: int) -> str:
    return f"{n:.0e}".replace("e+0", "e").replace("e+", "e")


@click.command()
@click.option("--events", "n", default=10_000_000, show_default=True,
              help="Events in the window for the largest round (also the fold measurement).")
@click.option("--baseline-events", "m", default=1_000_000, show_default=True,
              help="Largest window the reference design is timed on.")
@click.option("--batch", default=65_536, show_default=True, help="Events per fold call.")
@click.option("--runs", default=3, show_default=True, type=click.IntRange(1),
              help="Runs of every figure (median and range).")
@json_option()
def command(n: int, m: int, batch: int, runs: int, as_json: bool) -> None:
    """Fold N events per dim into DimStats; time a decision round (plan and rules mode) at
    N/100, N/10 and N events against the reference design's round, ported, at M/10 and M."""
    config = PolicyConfig()
    now = config.window_seconds
    seed = _seed_config(now)
    times, values = traffic(n, now)
    small = min(n, 1_000_000)
    sizes = (n // 100, n // 10, n)
    stats = {size: fold(config, *_every(times, values, n // size), batch) for size in sizes}
    result: dict[str, object] = {
        "events": n,
        "runs": runs,
        "distinct_values": sum(len(s.view(now).values) for s in stats[n].values()),
    }
    samples: dict[str, list[float]] = {}

    def sample(key: str, value: float) -> None:
        samples.setdefault(key, []).append(value)

    for run in range(runs):
        _, ms = _timed(fold, config, times, values, batch)
        sample("fold_events_per_second", n * len(DIMS) / ms * 1e3)
        _, ms = _timed(fold, config, times[:small], {k: v[:small] for k, v in values.items()},
                       4096)
        sample("fold_events_per_second_4ki", small * len(DIMS) / ms * 1e3)
        for size in sizes:
            sample(f"decide_ms_at_{_at(size)}",
                   _timed(_round, stats[size], now, config, repeat=ROUND_REPEATS)[1])
            sample(f"decide_seed_ms_at_{_at(size)}",
                   _timed(_round, stats[size], now, seed, repeat=ROUND_REPEATS)[1])
        for size in (m // 10, m):
            sub = _every(times, values, max(1, n // size))
            runtime, calls = reference(*sub, now)
            _, record_ms = _timed(_record, runtime, calls)
            if run == 0 and size == m:  # before its round changes the gears
                check_same(runtime, fold(config, *sub, batch), now, config)
            _, round_ms = _timed(runtime.run_once, now)
            sample(f"baseline_decide_ms_at_{_at(size)}", round_ms)
            del calls
        sample("baseline_record_events_per_second", len(sub[0]) * len(DIMS) / record_ms * 1e3)
        sample(f"baseline_decide_ms_at_{_at(n)}_extrapolated", round_ms / len(sub[0]) * n)
    del runtime
    for key, values_ in samples.items():
        summarise(result, key, values_)
    base = samples["baseline_record_events_per_second"]
    paired(result, "fold_speedup", samples["fold_events_per_second"], base)
    paired(result, "fold_speedup_4ki", samples["fold_events_per_second_4ki"], base)
    for size in (m // 10, m, n):
        key = f"baseline_decide_ms_at_{_at(size)}"
        key = key if key in samples else f"{key}_extrapolated"
        for mode in ("", "_seed"):
            mine = samples.get(f"decide{mode}_ms_at_{_at(size)}")
            if mine is not None and key in samples:
                paired(result, f"decide{mode}_speedup_at_{_at(size)}", samples[key], mine)
    echo_result(result, as_json)
