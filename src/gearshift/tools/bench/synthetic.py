"""`gearshift bench synthetic`: plan mode on one-hour traces that are not shipped.

Sixteen families of request sizes (stationary, heavy-tailed, multimodal, drifting, shifting,
stepping, bursty, sparse; the last five were added after the policy was tuned), each drawn
with several seeds and replayed from the default start (`ladder(1, M)`, as `gearshift
simulate` does). Per family: plan mode's padding over the hindsight-optimal
static set with as many gears as plan mode holds on average, rounded (the headline measure, goal
<= 1.25) and interpolated between the two nearest gear counts (no rounding luck), and over
the same count's optimum fitted on another draw of the family (held out: a static set chosen
in advance from the same traffic, not from the events it is scored on); the worst and the
mean over the seeds, with padding, mean gears and churn.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable

import click
import numpy as np

from gearshift.clikit import json_option
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import padded_work
from gearshift.tools.bench.priced import bench_priced, memory_markdown
from gearshift.tools.bench.priced import markdown as priced_markdown
from gearshift.tools.bench.simulate import held_out_gears, optimal_at
from gearshift.tools.simulate import policy_dims, simulate
from gearshift.tools.trace import Trace

HOUR = 3600.0
HELD_OUT = 1000  # the held-out optimum of seed s is fitted on seed s + HELD_OUT
PRICED_LEVELS = (0.0, 5.0)  # capture seconds of the priced part: the ends of bench simulate's
Draw = Callable[[np.random.Generator, np.ndarray], np.ndarray]

# family -> (dim, requests per second, sizes at times t)
FAMILIES: dict[str, tuple[str, float, Draw]] = {
    "lognormal": ("SEQLEN", 3.0, lambda r, t: r.lognormal(7.0, 0.8, t.size)),
    "uniform": ("SEQLEN", 3.0, lambda r, t: r.uniform(1, 4096, t.size)),
    "geometric batch": ("BATCHSIZE", 3.0, lambda r, t: r.geometric(0.25, t.size)),
    "pareto": ("SEQLEN", 3.0, lambda r, t: 64 * (1 + r.pareto(1.5, t.size))),
    "spikes": (
        "SEQLEN",
        3.0,
        lambda r, t: np.where(
            r.random(t.size) < 0.9, r.choice([128, 512, 2048], t.size), r.uniform(1, 8192, t.size)
        ),
    ),
    "bimodal": (
        "SEQLEN",
        3.0,
        lambda r, t: np.where(
            r.random(t.size) < 0.6, r.normal(600, 120, t.size), r.normal(3500, 500, t.size)
        ),
    ),
    "shift halfway": (
        "SEQLEN",
        3.0,
        lambda r, t: np.where(
            t > HOUR / 2, r.lognormal(8.0, 0.5, t.size), r.lognormal(6.0, 0.6, t.size)
        ),
    ),
    "drifting batch": ("BATCHSIZE", 3.0, lambda r, t: r.poisson(2 + 40 * t / HOUR) + 1),
    "sinusoidal drift": (
        "SEQLEN",
        3.0,
        lambda r, t: r.lognormal(6.5 + np.sin(2 * np.pi * t / 1800), 0.5),
    ),
    "bursts": (
        "SEQLEN",
        3.0,
        lambda r, t: np.where(
            t % 1200 < 120, r.lognormal(8.5, 0.3, t.size), r.lognormal(6.5, 0.7, t.size)
        ),
    ),
    "sparse": ("SEQLEN", 0.3, lambda r, t: r.lognormal(7.0, 0.8, t.size)),
    # Added after the policy was tuned, and never used to tune it.
    "gamma": ("SEQLEN", 3.0, lambda r, t: r.gamma(2.0, 500.0, t.size)),
    "zipf batch": ("BATCHSIZE", 3.0, lambda r, t: np.minimum(r.zipf(1.8, t.size), 64)),
    "trimodal": (
        "SEQLEN",
        3.0,
        lambda r, t: r.choice([300, 1500, 6000], t.size, p=[0.5, 0.35, 0.15])
        * r.lognormal(0.0, 0.15, t.size),
    ),
    "ramp": ("SEQLEN", 3.0, lambda r, t: r.lognormal(6.0 + 2.0 * t / HOUR, 0.5)),
    "step batch": (
        "BATCHSIZE",
        3.0,
        lambda r, t: r.poisson(np.select([t < HOUR / 3, t < 2 * HOUR / 3], [4, 16], 8)) + 1,
    ),
}


def synthetic(family: str, seed: int) -> Trace:
    """One hour of `family` (a FAMILIES key), sizes rounded and clipped to [1, 16384]."""
    dim, rate, draw = FAMILIES[family]
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0.0, HOUR, rng.poisson(rate * HOUR)))
    sizes = np.clip(np.round(draw(rng, t)), 1, 16384).astype(np.int64)
    return Trace(family, t, {dim: sizes})


def _held_out(trace: Trace, other: Trace, dim: str, k: int) -> float:
    """Padding on `trace` of the optimal `k` gears of `other` (another draw of its family),
    the largest raised to `trace`'s largest value so that every value has a gear."""
    values = trace.dims[dim]
    gears = held_out_gears(other.dims[dim], k, int(values.max()))
    return float(padded_work(gears, values, False).sum() / values.sum() - 1)


def run_trace(trace: Trace, config: PolicyConfig,
              other: Trace | None = None) -> dict[str, float]:
    """Plan mode on `trace`'s single dim against the optimum at its mean gear count: fitted
    on `trace` itself (hindsight), and, given `other`, on `other` (held out: what a static set
    chosen in advance from the same traffic could do)."""
    result = simulate(trace, policy_dims(trace, "adaptive"), config)
    ((dim, d),) = result.dims.items()
    rounded, between = optimal_at(trace, dim, d.mean_gears)
    out = {
        "padding_overhead": d.padding_overhead,
        "mean_gears": d.mean_gears,
        "churn_per_hour": (d.adds + d.evictions) / (result.duration / HOUR),
        "ratio": d.padding_overhead / rounded,
        "ratio_interpolated": d.padding_overhead / between,
    }
    if other is not None:
        held = _held_out(trace, other, dim, round(d.mean_gears))
        out["ratio_held_out"] = d.padding_overhead / held
    return out


@click.command()
@click.option("--seeds", default=5, show_default=True, help="Traces drawn per family.")
@click.option(
    "--family",
    "families",
    multiple=True,
    type=click.Choice(list(FAMILIES)),
    help="A family (default: all).",
)
@click.option("--priced/--no-priced", default=True, show_default=True,
              help="Also each family's first trace in device seconds (`bench simulate`'s "
              "model), at 0 and 5 s a capture: priced plan mode against the baselines.")
@json_option()
def command(seeds: int, families: tuple[str, ...], priced: bool, as_json: bool) -> None:
    """Plan mode on synthetic one-hour traces against the hindsight optimum at equal gear
    count (goal: ratio <= 1.25); priced, on traces the policy was not tuned on."""
    config = PolicyConfig()
    chosen = families or tuple(FAMILIES)
    costs = {f: bench_priced(synthetic(f, 0), PRICED_LEVELS) for f in chosen} if priced else {}
    out: dict[str, dict[str, float]] = {}
    for family in chosen:
        runs = [run_trace(synthetic(family, seed), config, synthetic(family, seed + HELD_OUT))
                for seed in range(seeds)]
        out[family] = {f"{key}_mean": statistics.fmean(r[key] for r in runs) for key in runs[0]}
        out[family] |= {
            f"{key}_worst": max(r[key] for r in runs)
            for key in ("ratio", "ratio_interpolated", "ratio_held_out")
        }
    if as_json:
        click.echo(json.dumps({"seeds": seeds, "families": out, "priced": costs}))
        return
    click.echo(
        "| family | worst ratio | mean ratio | worst, interpolated | worst, held out | padding "
        "| gears | adds+evictions/h |\n| --- | --- | --- | --- | --- | --- | --- | --- |"
    )
    for family, r in out.items():
        click.echo(
            f"| {family} | {r['ratio_worst']:.2f} | {r['ratio_mean']:.2f} | "
            f"{r['ratio_interpolated_worst']:.2f} | {r['ratio_held_out_worst']:.2f} | "
            f"{r['padding_overhead_mean']:.3f} | {r['mean_gears_mean']:.1f} | "
            f"{r['churn_per_hour_mean']:.0f} |"
        )
    if costs:
        click.echo("\n" + priced_markdown(costs) + "\n\n" + memory_markdown(costs))
