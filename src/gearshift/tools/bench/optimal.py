"""`gearshift bench optimal`: the Monge DP of `optimal_gears` against the plain quadratic DP.

Random distinct values with random weights; the quadratic DP (every split point of every
layer, vectorised) is the baseline, timed on the same input at a size it can afford, where
both must find the same cost. Every time is measured in each of `--runs` runs and reported as
median and range (`spread`), the speedup run by run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import click
import numpy as np

from gearshift.clikit import json_option
from gearshift.core.dims import padded_work
from gearshift.core.optimal import optimal_gears
from gearshift.tools.bench.cli import echo_result
from gearshift.tools.bench.spread import paired, summarise

T = TypeVar("T")


def quadratic_cost(values: np.ndarray, weights: np.ndarray, k: int) -> float:
    """Minimal sum(weight x gear) over at most k covering gears, in O(k n^2)."""
    order = np.argsort(values)
    v, w = values[order].astype(np.float64), weights[order]
    W, S = np.r_[0.0, np.cumsum(w)], np.r_[0.0, np.cumsum(w * v)]
    g = np.r_[0.0, v]
    j, i = np.arange(v.size + 1)[:, None], np.arange(v.size + 1)[None, :]
    run = np.where(i < j, g[j] * (W[j] - W[i]) - (S[j] - S[i]), np.inf)
    f = run[:, 0].copy()
    for _ in range(k - 1):
        f = np.r_[0.0, (f[None, :] + run)[1:].min(axis=1)]
    return float(f[-1] + S[-1])


def _timed(fn: Callable[..., T], *args: object) -> tuple[T, float]:
    began = time.perf_counter()
    out = fn(*args)
    return out, (time.perf_counter() - began) * 1e3


@click.command()
@click.option("--values", "n", default=10_000, show_default=True, help="Distinct values.")
@click.option(
    "--baseline-values",
    "m",
    default=1_500,
    show_default=True,
    help="Distinct values for the quadratic baseline.",
)
@click.option("--k", default=16, show_default=True, help="Gears.")
@click.option("--runs", default=3, show_default=True, type=click.IntRange(1),
              help="Runs of every figure (median and range).")
@json_option()
def command(n: int, m: int, k: int, runs: int, as_json: bool) -> None:
    """Time optimal_gears on N distinct values; speedup over the quadratic DP at M values."""
    rng = np.random.default_rng(0)
    values = rng.choice(np.arange(1, 20 * n + 1), size=n, replace=False)
    weights = rng.random(n)
    small, small_w = values[:m], weights[:m]
    times: dict[str, list[float]] = {"dp_ms": [], "dp_ms_at_baseline": [],
                                     "quadratic_ms_at_baseline": []}
    for _ in range(runs):
        times["dp_ms"].append(_timed(optimal_gears, values, k, weights)[1])
        gears, small_ms = _timed(optimal_gears, small, k, small_w)
        best, quad_ms = _timed(quadratic_cost, small, small_w, k)
        times["dp_ms_at_baseline"].append(small_ms)
        times["quadratic_ms_at_baseline"].append(quad_ms)
    cost = float((padded_work(gears, small, False) * small_w).sum())
    assert abs(cost - best) <= 1e-9 * best, (cost, best)
    result: dict[str, object] = {"values": n, "k": k, "baseline_values": m, "runs": runs}
    for key, samples in times.items():
        summarise(result, key, samples)
    paired(result, "speedup_at_baseline", times["quadratic_ms_at_baseline"],
           times["dp_ms_at_baseline"])
    echo_result(result, as_json)
