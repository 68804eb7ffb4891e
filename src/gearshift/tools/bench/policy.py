"""`gearshift bench policy`: folding events into DimStats, and one decision round vs events.

Traffic: one profile, BATCHSIZE (1..256) and SEQLEN (1..8192) log-normal sizes, spread evenly
over the window. A round (view + decide) is timed with N/100, N/10 and N events in the window.
Baseline, measured in the same run: the reference design (torch_npu `_adaptive_gears.py`),
which keeps every sample in a Python list and recomputes every gear's statistics per round
(statistics only: a lower bound on its round); both must give the same per-gear figures on the
same events.
"""

from __future__ import annotations

import bisect
import math
import statistics
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import click
import numpy as np

from gearshift.clikit import json_option
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim, Gears
from gearshift.core.gears import starting_gears
from gearshift.core.policy import decide
from gearshift.core.seed import gear_stats
from gearshift.core.stats import DimStats
from gearshift.tools.bench.cli import echo_result

T = TypeVar("T")
DIMS = {"BATCHSIZE": Dim(max=256), "SEQLEN": Dim(max=8192)}
SHAPE = {"BATCHSIZE": (3.0, 1.0), "SEQLEN": (6.0, 1.2)}  # log-normal mean and sigma


def _timed(fn: Callable[..., T], *args: object, repeat: int = 1) -> tuple[T, float]:
    """The result and the median wall time in ms over `repeat` runs."""
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        out = fn(*args)
        times.append((time.perf_counter() - began) * 1e3)
    return out, statistics.median(times)


def _traffic(n: int, window: float) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    times = np.sort(rng.uniform(0.0, window, n))
    values = {name: np.clip(rng.lognormal(*SHAPE[name], n), 1, dim.max).astype(np.int64)
              for name, dim in DIMS.items()}
    return times, values


def _every(times: np.ndarray, values: dict[str, np.ndarray],
           step: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Every step-th event: fewer events with the same spread over the window."""
    return times[::step], {k: v[::step] for k, v in values.items()}


def _fold(config: PolicyConfig, times: np.ndarray, values: dict[str, np.ndarray],
          batch: int) -> dict[str, DimStats]:
    stats = {name: DimStats(config) for name in DIMS}
    for name, s in stats.items():
        for i in range(0, len(times), batch):
            s.fold(times[i:i + batch], values[name][i:i + batch])
    return stats


def _round(stats: dict[str, DimStats], now: float, config: PolicyConfig) -> object:
    views = {name: s.view(now) for name, s in stats.items()}
    # The history (a longer horizon) of traffic that began a window ago holds the same events.
    return decide(DIMS, starting_gears(DIMS, 0.0), views, None, now, config, views)


class Baseline:
    """The reference design for one dim: every sample in its gear's Python list (recorded under
    a lock, as its record_event), every statistic recomputed from the lists each round."""

    def __init__(self, gears: Gears) -> None:
        self.gears = gears
        self.samples: dict[int, list[tuple[float, int, float, float]]] = {g: [] for g in gears}
        self.lock = threading.Lock()

    def record(self, t: float, raw: int) -> None:
        gear = self.gears[min(bisect.bisect_left(self.gears, raw), len(self.gears) - 1)]
        pad, split = ((gear - raw) / gear, 0.0) if raw <= gear else (0.0, (raw - gear) / raw)
        with self.lock:
            self.samples[gear].append((t, raw, pad, split))

    def stats(self, now: float, config: PolicyConfig) -> list[tuple]:
        """Per gear: (gear, hit rate, avg pad, avg split, pad median)."""
        lam = math.log(2) / config.half_life_seconds
        live = {g: [(math.exp(-lam * (now - t)), raw, pad, split)
                    for t, raw, pad, split in s if now - t <= config.window_seconds]
                for g, s in self.samples.items()}
        total = sum(w for s in live.values() for w, *_ in s) or 1.0
        out = []
        for g, s in live.items():
            weight = sum(w for w, *_ in s)
            pads = [raw for _, raw, _, split in s if not split and raw <= g]
            out.append((g, weight / total, sum(w * p for w, _, p, _ in s) / (weight or 1.0),
                        sum(w * sp for w, _, _, sp in s) / (weight or 1.0),
                        statistics.median(pads) if pads else None))
        return out


def _baseline_record(baselines: dict[str, Baseline], times: list[float],
                     values: dict[str, list[int]]) -> None:
    for i, t in enumerate(times):
        for name, b in baselines.items():
            b.record(t, values[name][i])


def _baseline_round(baselines: dict[str, Baseline], now: float,
                    config: PolicyConfig) -> dict[str, list]:
    return {name: b.stats(now, config) for name, b in baselines.items()}


def _check_same(table: dict[str, list], stats: dict[str, DimStats], now: float,
                config: PolicyConfig) -> None:
    """Both designs must give the same per-gear figures on the same events."""
    for name, dim in DIMS.items():
        mine = gear_stats(dim.initial_gears, stats[name].view(now), dim, config)
        for (gear, hit, pad, split, median), s in zip(table[name], mine, strict=True):
            got = (s.gear, s.hit_rate, s.avg_pad, s.avg_split, s.pad_median)
            assert np.allclose((gear, hit, pad, split, median or 0),
                               (*got[:4], got[4] or 0), rtol=1e-9, atol=1e-12), (gear, got)


def _at(n: int) -> str:
    return f"{n:.0e}".replace("e+0", "e").replace("e+", "e")


@click.command()
@click.option("--events", "n", default=10_000_000, show_default=True,
              help="Events in the window for the largest round (also the fold measurement).")
@click.option("--baseline-events", "m", default=1_000_000, show_default=True,
              help="Largest sample list the Python baseline is timed on.")
@click.option("--batch", default=65_536, show_default=True, help="Events per fold call.")
@json_option()
def command(n: int, m: int, batch: int, as_json: bool) -> None:
    """Fold N events per dim into DimStats; time a decision round at N/100, N/10, N events
    against the reference design's list-based round at M/10 and M events."""
    config = PolicyConfig()
    now = config.window_seconds
    times, values = _traffic(n, now)
    stats, fold_ms = _timed(_fold, config, times, values, batch)
    small = min(n, 1_000_000)
    first = {k: v[:small] for k, v in values.items()}
    _, fold_4ki_ms = _timed(_fold, config, times[:small], first, 4096)
    result: dict[str, float | int] = {
        "events": n,
        "distinct_values": sum(len(s.view(now).values) for s in stats.values()),
        "fold_events_per_second": n * len(DIMS) / fold_ms * 1e3,
        "fold_events_per_second_4ki": small * len(DIMS) / fold_4ki_ms * 1e3,
    }
    for size in (n // 100, n // 10):
        sub = _fold(config, *_every(times, values, n // size), batch)
        result[f"decide_ms_at_{_at(size)}"] = _timed(_round, sub, now, config, repeat=5)[1]
    result[f"decide_ms_at_{_at(n)}"] = _timed(_round, stats, now, config, repeat=5)[1]

    for size in (m // 10, m):
        sub_times, sub_values = _every(times, values, max(1, n // size))
        baselines = {name: Baseline(dim.initial_gears) for name, dim in DIMS.items()}
        _, record_ms = _timed(_baseline_record, baselines, sub_times.tolist(),
                              {k: v.tolist() for k, v in sub_values.items()})
        table, round_ms = _timed(_baseline_round, baselines, now, config)
        result[f"baseline_decide_ms_at_{_at(size)}"] = round_ms
    _check_same(table, _fold(config, sub_times, sub_values, batch), now, config)
    result["baseline_record_events_per_second"] = len(sub_times) * len(DIMS) / record_ms * 1e3
    result["fold_speedup"] = (result["fold_events_per_second"]
                              / result["baseline_record_events_per_second"])
    if f"decide_ms_at_{_at(m)}" in result:
        result[f"decide_speedup_at_{_at(m)}"] = round_ms / result[f"decide_ms_at_{_at(m)}"]
    extrapolated = round_ms / len(sub_times) * n
    result[f"baseline_decide_ms_at_{_at(n)}_extrapolated"] = extrapolated
    result[f"decide_speedup_at_{_at(n)}"] = extrapolated / result[f"decide_ms_at_{_at(n)}"]
    echo_result(result, as_json)
