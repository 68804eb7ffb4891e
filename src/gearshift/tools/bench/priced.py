"""The priced part of `gearshift bench simulate`: every shipped trace in device seconds, at
capture costs of CAPTURE_LEVELS seconds per gear, against pow2, rules mode, today's unpriced
plan mode and the hindsight-optimal static set at equal mean gears, and at equal graph memory:
priced mode runs under the default bound (`core.memory.bound`, in the bytes model of
`memory_model`), against the optimal static set whose graphs fit it (`fitting_optimum`) and
the clairvoyant that fits it from the first round on (`fitting_after_start`), every mode's
peak and time-weighted graph bytes beside.

Device time (`device_costs`) is a roofline model of Llama-3-8B in bf16 on one H100 SXM, its
constants in docs/policy.md ("The device-time model"); the device's memory, the bound's floor's
share, is that H100's 80 GB. A replay's `device_overhead` is
(padded device seconds + capture seconds) / raw device seconds - 1; a static set (pow2, the
optimum) captures its gears once at the start, the adaptive modes each gear they add and each
start-up gear the first time traffic reaches it. Unpriced runs do not depend on the capture
cost, so they run once, with their captures counted and priced per level afterwards.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from gearshift.core.config import PolicyConfig
from gearshift.core.costs import Line
from gearshift.core.dims import Dim, padded_cost
from gearshift.core.optimal import optimal_sets
from gearshift.tools.bench.memory_model import fitting_after_start, fitting_optimum, graph_bytes
from gearshift.tools.simulate import (
    Device,
    DimResult,
    SimulationResult,
    odd_runs,
    policy_dims,
    reached,
    segment_runs,
    simulate,
)
from gearshift.tools.trace import Trace

CAPTURE_LEVELS = (0.0, 0.05, 0.5, 5.0)  # seconds per gear captured
WORKERS = 1  # one worker per device, as vLLM and SGLang run
DEVICE_MEMORY = 80e9  # the H100 SXM's 80 GB of HBM3: the default bound's floor is a share of it

# Llama-3-8B (32 layers, hidden 4096, 8 KV heads of 128, 8.03e9 parameters) in bf16 on one
# H100 SXM (989 TFLOPS dense bf16, 3.35 TB/s HBM3), at 50 % of peak compute and 70 % of
# peak bandwidth:
WEIGHTS_S = 16.06e9 / (0.7 * 3.35e12)  # reading the weights once: every step's floor
TOKEN_S = 2 * 8.03e9 / (0.5 * 989e12)  # the linear layers' FLOPs per token
ATTENTION_S = 2 * 32 * 4096 / (0.5 * 989e12)  # causal attention's FLOPs per token^2
KV_ROW_S = 2 * 32 * 8 * 128 * 2 * 1500 / (0.7 * 3.35e12)  # a decode row's KV cache (1,500 tokens)
PREFILL = (WEIGHTS_S, TOKEN_S, ATTENTION_S)  # seconds of a prefill of S tokens, in S
DECODE = (WEIGHTS_S, KV_ROW_S)  # seconds of a decode step of B rows, in B


def device_costs(trace: Trace) -> dict[str, tuple[float, ...]]:
    """Each dim's `Dim.cost` in device seconds: SEQLEN a prefill of that many tokens; BATCHSIZE
    a decode step of that many rows, or in a batched prefill trace that many prompts of the
    trace's median length."""
    out = {}
    for name in trace.dims:
        if name == "SEQLEN":
            out[name] = PREFILL
        elif "SEQLEN" in trace.dims:
            s = float(np.median(trace.dims["SEQLEN"]))
            out[name] = (WEIGHTS_S, TOKEN_S * s + ATTENTION_S * s * s)
        else:
            out[name] = DECODE
    return out


def _figures(d: DimResult, hours: float, capture: float, per: float | None = None) -> dict:
    """A run's figures at `capture` seconds per gear; `per` (unpriced runs): it was replayed
    at 1 s per gear, so its capture seconds are its captures x `capture`."""
    seconds = d.capture_seconds if per is None else d.captures * capture * WORKERS
    return {"device_overhead": (d.padded_cost + seconds) / d.raw_cost - 1.0,
            "padding_overhead": d.cost_overhead, "mean_gears": d.mean_gears,
            "captures": d.captures, "capture_seconds": seconds,
            "changes_per_hour": (d.adds + d.evictions) / hours,
            "peak_bytes": d.peak_bytes, "mean_bytes": d.mean_bytes}


def bench_priced(trace: Trace, levels: tuple[float, ...] = CAPTURE_LEVELS
                 ) -> dict[str, dict[str, dict]]:
    """Per dim, per capture level of `levels` (its str): every mode's figures, and the priced
    mode's device overhead over the optimum's (`ratio`), pow2's and unpriced plan's."""
    cost, hours = device_costs(trace), trace.duration / 3600.0
    held = graph_bytes(trace)
    once = Device(Line(1.0), WORKERS, lazy=True, bytes=held)
    static = Device(Line(1.0), WORKERS, bytes=held)
    adaptive = policy_dims(trace, "adaptive", cost=cost)
    fixed = {
        "pow2": simulate(trace, policy_dims(trace, "pow2", cost=cost), PolicyConfig(),
                         adaptive=False, device=static),
        "seed": simulate(trace, adaptive, PolicyConfig(policy_mode="rules"), device=once),
        "plan": simulate(trace, adaptive, PolicyConfig(), device=once),
    }
    out: dict[str, dict[str, dict]] = {d: {} for d in trace.dims}
    for level in levels:
        device = Device(Line(level), WORKERS, priced=True, lazy=True, bytes=held,
                        memory=DEVICE_MEMORY)
        priced = simulate(trace, adaptive, PolicyConfig(), device=device)
        for dim in trace.dims:
            # the dim's share of the device's bound: what its own start-up gears give it (the
            # priced run's dims share the whole, `device_budget`)
            budget = device.budget({dim: adaptive[dim]}, PolicyConfig())
            row = {m: _figures(r.dims[dim], hours, level, per=1.0) for m, r in fixed.items()}
            row["priced"] = p = _figures(priced.dims[dim], hours, level)
            row["optimal"] = o = _optimal(trace, dim, cost, p["mean_gears"], level)
            row["ratio"] = _ratio(p["device_overhead"], o["device_overhead"])
            row["held_out_ratio"] = _held_out(trace, priced, dim, adaptive[dim], level)
            row["after_start"] = a = _after_start(trace, dim, adaptive[dim], p["mean_gears"], level)
            row["vs_after_start"] = _ratio(p["device_overhead"], a)
            row["vs_past"] = _past(trace, priced, dim, adaptive[dim])
            row["vs_pow2"] = _ratio(p["device_overhead"], row["pow2"]["device_overhead"])
            row["vs_plan"] = _ratio(p["device_overhead"], row["plan"]["device_overhead"])
            row["budget"], row["device_budget"] = budget, priced.budget
            row["fit"] = f = fitting_optimum(trace.dims[dim], adaptive[dim], held[dim], budget,
                                             level, WORKERS)
            row["vs_fit"] = _ratio(p["device_overhead"], f["device_overhead"])
            early = trace.t - trace.t[0] < PolicyConfig().update_interval_seconds
            row["fit_after_start"] = fa = fitting_after_start(
                trace.dims[dim], early, adaptive[dim], held[dim], budget, level, WORKERS)
            row["vs_fit_after_start"] = _ratio(p["device_overhead"], fa)
            out[dim][f"{level:g}"] = row
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else (1.0 if a <= 0 else math.inf)


def _optimal(trace: Trace, dim: str, cost: dict, mean_gears: float, level: float) -> dict:
    """The hindsight-optimal static set of `dim` at `mean_gears`, interpolated between the two
    nearest counts, each with its captures once."""

    def at(k: int) -> np.ndarray:
        dims = policy_dims(trace, "optimal", k={dim: k}, cost=cost)
        d = simulate(trace, dims, PolicyConfig(), adaptive=False,
                     device=Device(Line(level), WORKERS)).dims[dim]
        return np.array([d.device_overhead, d.cost_overhead])

    mix = _between(mean_gears, at)
    return {"device_overhead": float(mix[0]), "padding_overhead": float(mix[1]),
            "mean_gears": mean_gears}


def _between(mean_gears: float, at: Callable[[int], Any]) -> Any:
    """`at(k)` at a fractional gear count: interpolated between the two nearest counts >= 1."""
    low = max(math.floor(mean_gears), 1)
    share = mean_gears - low
    return at(low) * (1 - share) + at(low + 1) * share


def _fitted(values: np.ndarray, k: int, priced: Dim, top: int) -> tuple[int, ...]:
    """The optimal set of `k` gears for `values`, its largest raised to `top` (the trace's
    largest value: a static set chosen on part of the trace must still cover all of it)."""
    best = optimal_sets(values, k, cost=priced.work).gears(k)
    return (*best[:-1], max(best[-1], top))


def _after_start(trace: Trace, dim: str, priced: Dim, mean_gears: float, level: float) -> float:
    """The device overhead of a clairvoyant that starts as the adaptive modes do: on the
    start-up gears (each captured the first time traffic reaches it, the largest at once) until
    the first decision round, then on the hindsight-optimal static set of `mean_gears`
    (interpolated), capturing those of its gears not captured yet. What knowing the whole
    trace from the first round on would give, start-up captures paid."""
    values, t = trace.dims[dim], trace.t - trace.t[0]
    early = t < PolicyConfig().update_interval_seconds
    start = priced.initial_gears
    held = {*reached(priced, values[early], (start,), np.array([early.sum()])), start[-1]}
    head = float(padded_cost(priced, start, values[early]).sum())
    raw = float(priced.work(values).sum())

    def at(k: int) -> float:
        best = optimal_sets(values, k, cost=priced.work).gears(k)
        tail = float(padded_cost(priced, best, values[~early]).sum())
        return (head + tail + level * WORKERS * len(held | set(best))) / raw - 1.0

    return float(_between(mean_gears, at))


def _past(trace: Trace, run: SimulationResult, dim: str, priced: Dim) -> float:
    """Priced mode's padding (device seconds) on the trace's second half over that of the
    optimal static set fitted on the first half, of as many gears as priced mode held there
    (rounded), its largest raised to the trace's largest value: against the best set chosen on
    past traffic, where `ratio` compares with one that knows the traffic to come."""
    values, t = trace.dims[dim], trace.t - trace.t[0]
    late = t >= t[-1] / 2
    if late.all():
        return math.nan
    ran = [(g, v) for g, v in zip(run.dims[dim].gears, segment_runs(trace, run, dim,
                                                                     np.flatnonzero(late)),
                                   strict=True) if v.size]
    mine = sum(float(padded_cost(priced, g, v).sum()) for g, v in ran)
    k = max(1, round(float(np.mean([len(g) for g, _ in ran]))))
    gears = _fitted(values[~late], k, priced, int(values.max()))
    raw = float(priced.work(values[late]).sum())
    theirs = float(padded_cost(priced, gears, values[late]).sum())
    return _ratio(mine / raw - 1.0, theirs / raw - 1.0)


def _held_out(trace: Trace, run: SimulationResult, dim: str, priced: Dim, level: float) -> float:
    """Priced over optimal device overhead, both scored on the odd events, the optimum of as
    many gears (interpolated) fitted on the even ones, its largest raised to the trace's
    largest value (a static set chosen in advance); captures count in the odd events' share of
    the raw seconds."""
    values = trace.dims[dim]
    odd, runs = odd_runs(trace, run, dim)
    share = float(priced.work(values[odd]).sum() / priced.work(values).sum())
    d = run.dims[dim]
    mine = sum(float(padded_cost(priced, g, v).sum()) for g, v in zip(d.gears, runs, strict=True))
    raw = float(priced.work(values[odd]).sum())
    ours = (mine + d.capture_seconds * share) / raw - 1.0

    def at(k: int) -> float:
        gears = _fitted(values[::2], k, priced, int(values.max()))
        padded = float(padded_cost(priced, gears, values[odd]).sum())
        return (padded + level * WORKERS * len(gears) * share) / raw - 1.0

    return _ratio(ours, float(_between(d.mean_gears, at)))


def markdown(traces: dict[str, dict[str, dict[str, dict]]]) -> str:
    """The priced table of docs/policy.md: per trace, dim and capture level, device overhead
    (padding, mean gears, changes per hour) of each mode."""
    lines = ["| trace | dim | capture s | pow2 | seed | plan (unpriced) | priced | optimal at "
             "priced's gears | priced / optimal | priced / held-out | priced / after start-up | "
             "priced / past (2nd half) | priced / pow2 | priced / plan |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
             "| --- |"]

    def cell(m: dict) -> str:
        return (f"{m['device_overhead']:.3f} ({m['padding_overhead']:.3f}, "
                f"{m['mean_gears']:.1f}, {m.get('changes_per_hour', 0.0):.0f})")

    for trace, dims in traces.items():
        for dim, levels in dims.items():
            for level, r in levels.items():
                lines.append(
                    f"| {trace.removeprefix('azure_')} | {dim} | {level} | {cell(r['pow2'])} "
                    f"| {cell(r['seed'])} | {cell(r['plan'])} | {cell(r['priced'])} "
                    f"| {r['optimal']['device_overhead']:.3f} | {r['ratio']:.2f} "
                    f"| {r['held_out_ratio']:.2f} | {r['vs_after_start']:.2f} "
                    f"| {r['vs_past']:.2f} "
                    f"| {r['vs_pow2']:.2f} | {r['vs_plan']:.2f} |")
    return "\n".join(lines)


def memory_markdown(traces: dict[str, dict[str, dict[str, dict]]]) -> str:
    """The table at equal graph memory of docs/benchmarks.md: per trace, dim and capture level,
    the bound (MiB) and each mode's device overhead (padding, peak and mean MiB, mean gears,
    changes per hour); the optimum is the static set that fits the bound; after start-up, the
    clairvoyant that fits it from the first round on (`fitting_after_start`)."""
    lines = ["| trace | dim | capture s | bound MiB | pow2 | seed | plan (unpriced) | priced "
             "(bounded) | optimal that fits | priced / pow2 | priced / plan | priced / optimal "
             "| priced / after start-up |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

    def cell(m: dict) -> str:
        return (f"{m['device_overhead']:.3f} ({m['padding_overhead']:.3f}, "
                f"{m['peak_bytes'] / 2**20:,.0f}/{m['mean_bytes'] / 2**20:,.0f}, "
                f"{m['mean_gears']:.1f}, {m.get('changes_per_hour', 0.0):.0f})")

    for trace, dims in traces.items():
        for dim, levels in dims.items():
            for level, r in levels.items():
                bound = "none" if r["budget"] is None else f"{r['budget'] / 2**20:,.0f}"
                lines.append(
                    f"| {trace.removeprefix('azure_')} | {dim} | {level} | {bound} "
                    f"| {cell(r['pow2'])} | {cell(r['seed'])} | {cell(r['plan'])} "
                    f"| {cell(r['priced'])} | {cell(r['fit'])} | {r['vs_pow2']:.2f} "
                    f"| {r['vs_plan']:.2f} | {r['vs_fit']:.2f} "
                    f"| {r['vs_fit_after_start']:.2f} |")
    return "\n".join(lines)
