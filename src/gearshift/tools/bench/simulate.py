"""`gearshift bench simulate`: the policy modes on the shipped traces against their baselines.

Per trace and dim, all replayed here: `pow2`, the power-of-two ladder up to the trace's largest
value M, and M (where the adaptive modes start: the same top), and `pow2_ceil`, the ladder up
to the power of two above M (one gear higher, as a server configured in powers of two has it);
rules mode deciding every 300 s (key `seed`, its default) and every 60 s (`seed_60`, the reference
implementation's update interval), `seed_margin` the padding of the stronger of the two over
plan mode's; plan mode; and the hindsight-optimal static set with as many gears as plan mode
holds on average, rounded (`optimal.padding_overhead`) and interpolated between the two gear
counts nearest the mean (`optimal.interpolated_padding_overhead`: a time mix of the two static
optima, what a policy with that mean gear count could pad at best on stationary traffic, no
rounding luck). Every ratio to the optimum is a padding-overhead ratio, plan / optimum (over 1:
plan pads more): `ratio` at the rounded count (the goal: <= 1.25), `interpolated_ratio`, and
`held_out_ratio`, both scored on the odd events with the optimum fitted on the even ones (a
static set chosen in advance from the same traffic); `seed_ratio` is rules mode's (300 s) over
the optimum at its own mean gear count.
"""

from __future__ import annotations

import json
import math
import time

import click
import numpy as np

from gearshift.clikit import json_option
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Gears, ladder, padded_work
from gearshift.core.optimal import optimal_gears
from gearshift.tools.bench.priced import bench_priced, memory_markdown
from gearshift.tools.bench.priced import markdown as priced_markdown
from gearshift.tools.simulate import (
    SPLITTABLE,
    DimResult,
    SimulationResult,
    odd_runs,
    policy_dims,
    simulate,
)
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
    odd, runs = odd_runs(trace, result, dim)
    gears = result.dims[dim].gears
    plan = sum(int(padded_work(g, v, split).sum()) for g, v in zip(gears, runs, strict=True))
    best = padded_work(held_out_gears(values[::2], k, int(values.max())), values[odd], split).sum()
    raw = int(values[odd].sum())
    return (plan - raw) / (best - raw) if best > raw else float("inf")


def pow2_ceil_gears(trace: Trace) -> dict[str, Gears]:
    """Per dim, the power-of-two ladder up to the power of two at or above its largest value."""
    return {d: ladder(1, 1 << (int(v.max()) - 1).bit_length()) for d, v in trace.dims.items()}


def bench_trace(name: str) -> dict[str, dict[str, object]]:
    """Every dim of one trace: both pow2 ladders, rules mode at 300 and 60 s, plan mode, and
    the optimum at plan's mean gear count."""
    trace = load_trace(name)
    hours = trace.duration / 3600.0
    ceil = policy_dims(trace, "static", gears=pow2_ceil_gears(trace))
    seed_60 = PolicyConfig(policy_mode="rules", update_interval_seconds=60.0)
    runs = {
        "pow2": simulate(trace, policy_dims(trace, "pow2"), PolicyConfig(), adaptive=False),
        "pow2_ceil": simulate(trace, ceil, PolicyConfig(), adaptive=False),
        "seed": simulate(trace, policy_dims(trace, "adaptive"), PolicyConfig(policy_mode="rules")),
        "seed_60": simulate(trace, policy_dims(trace, "adaptive"), seed_60),
        "plan": simulate(trace, policy_dims(trace, "adaptive"), PolicyConfig(policy_mode="plan")),
    }
    out = {}
    for dim in trace.dims:
        row: dict[str, object] = {mode: _figures(r.dims[dim], hours) for mode, r in runs.items()}
        plan, seed = runs["plan"].dims[dim], runs["seed"].dims[dim]
        k = round(plan.mean_gears)
        best, between = optimal_at(trace, dim, plan.mean_gears)
        row["optimal"] = {"k": k, "padding_overhead": best, "mean_gears": plan.mean_gears,
                          "interpolated_padding_overhead": between}
        stronger = min(seed.padding_overhead, runs["seed_60"].dims[dim].padding_overhead)
        row["seed_margin"] = stronger / plan.padding_overhead
        row["ratio"] = plan.padding_overhead / best if best else float("inf")
        row["interpolated_ratio"] = plan.padding_overhead / between if between else float("inf")
        row["held_out_ratio"] = _held_out(trace, runs["plan"], dim, k)
        seed_best = optimal_padding(trace, dim, round(seed.mean_gears))
        row["seed_ratio"] = seed.padding_overhead / seed_best if seed_best else float("inf")
        out[dim] = row
    return out


def _mode(m: dict[str, float]) -> str:
    churn = m["adds_per_hour"] + m["evictions_per_hour"]
    return f"{m['padding_overhead']:.3f}, {m['mean_gears']:.1f}, {churn:.0f}"


def markdown(result: dict[str, object]) -> str:
    """The report table of docs/policy.md."""
    lines = ["| trace | dim | pow2 to M | pow2 to 2^k >= M | seed 300 s: pad, gears, "
             "adds+evictions/h | seed 60 s | plan | seed / plan | optimal at plan's K, "
             "rounded; interpolated | plan / optimal | plan / interpolated | plan / held-out |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for trace, dims in result["traces"].items():  # type: ignore[union-attr]
        for dim, r in dims.items():
            o = r["optimal"]
            lines.append(
                f"| {trace.removeprefix('azure_')} | {dim} | {r['pow2']['padding_overhead']:.3f}"
                f" | {r['pow2_ceil']['padding_overhead']:.3f} | {_mode(r['seed'])}"
                f" | {_mode(r['seed_60'])} | {_mode(r['plan'])} | {r['seed_margin']:.2f}"
                f" | {o['padding_overhead']:.3f} (K={o['k']}); "
                f"{o['interpolated_padding_overhead']:.3f} (K={o['mean_gears']:.2f})"
                f" | {r['ratio']:.2f} | {r['interpolated_ratio']:.2f}"
                f" | {r['held_out_ratio']:.2f} |")
    return "\n".join(lines)


@click.command()
@click.option("--trace", "names", multiple=True, help="A shipped trace (default: all).")
@json_option()
def command(names: tuple[str, ...], as_json: bool) -> None:
    """Replay the shipped traces under both pow2 ladders, rules mode (every 300 s and 60 s)
    and plan mode; plan's padding against the hindsight optimum at its mean gear count (goal:
    ratio <= 1.25). Then in device seconds at capture costs of 0, 0.05, 0.5 and 5 s per gear:
    priced plan mode against pow2, rules mode, unpriced plan and the optimum at equal mean gears;
    and at equal graph memory (priced under the default bound, the optimum that fits it)."""
    began = time.perf_counter()
    names = names or shipped_traces()
    traces = {name: bench_trace(name) for name in names}
    ratios = [r["ratio"] for dims in traces.values() for r in dims.values()]
    priced = {name: bench_priced(load_trace(name)) for name in names}
    result = {"traces": traces, "worst_ratio": max(ratios), "priced": priced,
              "wall_seconds": time.perf_counter() - began}
    click.echo(json.dumps(result) if as_json
               else markdown(result) + "\n\n" + priced_markdown(priced) + "\n\n"
               + memory_markdown(priced))
