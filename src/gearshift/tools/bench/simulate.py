"""`gearshift bench simulate`: the policy modes on the shipped traces against their baselines.

Per trace and dim: the power-of-two ladder, seed mode, plan mode, and the hindsight-optimal
static set with as many gears as plan mode holds on average (rounded), all replayed here;
`ratio` is plan mode's padding over that optimum's (the goal: <= 1.25), `seed_ratio` seed
mode's over the optimum at its own mean gear count. `interpolated_ratio` compares with the
optimum interpolated between the two gear counts nearest the mean: a time mix of the two static
optima, what a policy with the same mean gear count could pad at best on stationary traffic
(no rounding luck). That optimum is fitted on the very events it is scored on;
`held_out_ratio` scores both on the odd events, the optimum fitted on the even ones: what a
static set chosen in advance from the same traffic could do.
"""

from __future__ import annotations

import json
import math
import time

import click
import numpy as np

from gearshift.clikit import json_option
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Gears, padded_work
from gearshift.core.optimal import optimal_gears
from gearshift.tools.simulate import SPLITTABLE, DimResult, SimulationResult, policy_dims, simulate
from gearshift.tools.trace import Trace, load_trace, shipped_traces


def _figures(d: DimResult, hours: float) -> dict[str, float]:
    return {"padding_overhead": d.padding_overhead, "mean_gears": d.mean_gears,
            "adds_per_hour": d.adds / hours, "evictions_per_hour": d.evictions / hours,
            "eager_events": d.eager_events, "split_events": d.split_events}


def optimal_padding(trace: Trace, dim: str, k: int) -> float:
    """Padding of the hindsight-optimal `k` gears of `dim` on `trace`."""
    dims = policy_dims(trace, "optimal", k={dim: k})
    return simulate(trace, dims, PolicyConfig(), adaptive=False).dims[dim].padding_overhead


def optimal_at(trace: Trace, dim: str, mean_gears: float) -> tuple[float, float]:
    """The hindsight optimum's padding of `dim` at `mean_gears` rounded, and interpolated
    between the two nearest gear counts."""
    low = math.floor(mean_gears)
    below, above = optimal_padding(trace, dim, low), optimal_padding(trace, dim, low + 1)
    share = mean_gears - low
    return above if round(mean_gears) > low else below, below * (1 - share) + above * share


def held_out_gears(fit: np.ndarray, k: int, top: int) -> Gears:
    """The optimal `k` gears of the values `fit`, the largest raised to `top` at least, so that
    every value up to `top` has a gear: a static set chosen in advance."""
    *lower, largest = optimal_gears(fit, k)
    return (*lower, max(largest, top))


def _held_out(trace: Trace, result: SimulationResult, dim: str, k: int) -> float:
    """Plan mode's padding over that of the optimal `k` gears of the even events (the largest
    raised to the trace's largest value), both on the odd events."""
    values, split = trace.dims[dim], dim in SPLITTABLE
    seg = np.searchsorted(result.starts, trace.t - trace.t[0], "right") - 1
    odd = np.arange(1, values.size, 2)
    runs = np.split(values[odd], np.searchsorted(seg[odd], np.arange(1, len(result.starts))))
    gears = result.dims[dim].gears
    plan = sum(int(padded_work(g, v, split).sum()) for g, v in zip(gears, runs, strict=True))
    best = padded_work(held_out_gears(values[::2], k, int(values.max())), values[odd], split).sum()
    raw = int(values[odd].sum())
    return (plan - raw) / (best - raw) if best > raw else float("inf")


def bench_trace(name: str) -> dict[str, dict[str, object]]:
    """Every dim of one trace: pow2, seed, plan, optimal at plan's mean gear count."""
    trace = load_trace(name)
    hours = trace.duration / 3600.0
    runs = {
        "pow2": simulate(trace, policy_dims(trace, "pow2"), PolicyConfig(), adaptive=False),
        "seed": simulate(trace, policy_dims(trace, "adaptive"), PolicyConfig(policy_mode="seed")),
        "plan": simulate(trace, policy_dims(trace, "adaptive"), PolicyConfig(policy_mode="plan")),
    }
    out = {}
    for dim in trace.dims:
        row: dict[str, object] = {mode: _figures(r.dims[dim], hours) for mode, r in runs.items()}
        plan, seed = runs["plan"].dims[dim], runs["seed"].dims[dim]
        k = round(plan.mean_gears)
        best, between = optimal_at(trace, dim, plan.mean_gears)
        row["optimal"] = {"k": k, "padding_overhead": best}
        row["ratio"] = plan.padding_overhead / best if best else float("inf")
        row["interpolated_ratio"] = plan.padding_overhead / between if between else float("inf")
        row["held_out_ratio"] = _held_out(trace, runs["plan"], dim, k)
        seed_best = optimal_padding(trace, dim, round(seed.mean_gears))
        row["seed_ratio"] = seed.padding_overhead / seed_best if seed_best else float("inf")
        out[dim] = row
    return out


def markdown(result: dict[str, object]) -> str:
    """The report table of docs/policy.md."""
    lines = ["| trace | dim | pow2 | seed: pad, gears, adds+evictions/h | "
             "plan: pad, gears, adds+evictions/h | optimal at plan's K | plan / optimal | "
             "plan / interpolated optimal | plan / held-out optimal |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for trace, dims in result["traces"].items():  # type: ignore[union-attr]
        for dim, r in dims.items():
            s, p = r["seed"], r["plan"]
            lines.append(
                f"| {trace.removeprefix('azure_')} | {dim} | {r['pow2']['padding_overhead']:.3f}"
                f" | {s['padding_overhead']:.3f}, {s['mean_gears']:.1f}, "
                f"{s['adds_per_hour'] + s['evictions_per_hour']:.0f}"
                f" | {p['padding_overhead']:.3f}, {p['mean_gears']:.1f}, "
                f"{p['adds_per_hour'] + p['evictions_per_hour']:.0f}"
                f" | {r['optimal']['padding_overhead']:.3f} (K={r['optimal']['k']})"
                f" | {r['ratio']:.2f} | {r['interpolated_ratio']:.2f}"
                f" | {r['held_out_ratio']:.2f} |")
    return "\n".join(lines)


@click.command()
@click.option("--trace", "names", multiple=True, help="A shipped trace (default: all).")
@json_option()
def command(names: tuple[str, ...], as_json: bool) -> None:
    """Replay the shipped traces under pow2, seed and plan mode; plan's padding against the
    hindsight optimum at its mean gear count (goal: ratio <= 1.25)."""
    began = time.perf_counter()
    traces = {name: bench_trace(name) for name in names or shipped_traces()}
    ratios = [r["ratio"] for dims in traces.values() for r in dims.values()]
    result = {"traces": traces, "worst_ratio": max(ratios),
              "wall_seconds": time.perf_counter() - began}
    click.echo(json.dumps(result) if as_json else markdown(result))
