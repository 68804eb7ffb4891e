"""The graph-bytes part of `gearshift bench simulate`: what a graph holds in the Llama-3-8B
model of `tools/bench/priced.py`, and the hindsight-optimal static set that fits a budget.

A graph's private pool holds its intermediate activations; the KV cache and the weights are
allocated outside it. Per token (prefill) or row (decode), in bf16, the peak is the MLP's:
the residual and normed hidden states (2 × 4 096), the gate and up projections (2 × 14 336)
and their product (14 336), 61 440 values of 2 bytes; a decode row also holds its logits,
128 256 values of 4 bytes (fp32). Every graph holds at least one 2 MiB segment
(`core.memory.MODEL_GRAPH_BYTES`). Constants and sources: docs/policy.md, "The memory model".
"""

from __future__ import annotations

import numpy as np

from gearshift.core.costs import Line
from gearshift.core.dims import Dim, padded_cost
from gearshift.core.memory import MODEL_GRAPH_BYTES
from gearshift.core.optimal import optimal_sets
from gearshift.tools.simulate import reached
from gearshift.tools.trace import Trace

TOKEN_BYTES = 2 * (2 * 4096 + 2 * 14336 + 14336)  # a prefill token's activations: 122,880
ROW_BYTES = TOKEN_BYTES + 4 * 128256  # a decode row's, with its fp32 logits: 635,904
FLOOR_BYTES = float(MODEL_GRAPH_BYTES)  # a graph's pool: one 2 MiB segment at least
MOST_GEARS = 64  # the largest static set tried (max_gears_per_type)


def graph_bytes(trace: Trace) -> dict[str, Line]:
    """Each dim's bytes per graph: FLOOR_BYTES + per token (SEQLEN), per row (BATCHSIZE of a
    decode trace), or per prompt of the trace's median length (BATCHSIZE of a batched prefill)."""
    out = {}
    for name in trace.dims:
        if name == "SEQLEN":
            out[name] = Line(FLOOR_BYTES, float(TOKEN_BYTES))
        elif "SEQLEN" in trace.dims:
            s = float(np.median(trace.dims["SEQLEN"]))
            out[name] = Line(FLOOR_BYTES, TOKEN_BYTES * s)
        else:
            out[name] = Line(FLOOR_BYTES, float(ROW_BYTES))
    return out


def fitting_optimum(values: np.ndarray, dim: Dim, line: Line, budget: float | None,
                    capture: float, workers: int = 1) -> dict[str, float]:
    """The hindsight-optimal static set whose graphs fit `budget` bytes (on every worker):
    of the padding-optimal sets of 1 to MOST_GEARS gears (each ending at the largest value),
    the one of least device overhead, its captures (`capture` seconds a gear) counted once.
    The optimum under a bytes constraint may hold other gears than a count's optimum: this
    is an upper bound on it."""
    raw = float(dim.work(values).sum())
    sets = optimal_sets(values, MOST_GEARS, cost=dim.work)
    best: dict[str, float] = {}
    for k in range(1, sets.costs.size + 1):
        gears = sets.gears(k)
        held = float(line(np.asarray(gears, float)).sum()) * workers
        if budget is not None and held > budget and k > 1:
            continue
        padded = float(padded_cost(dim, gears, values).sum())
        device = (padded + capture * workers * len(gears)) / raw - 1.0
        if not best or device < best["device_overhead"]:
            best = {"device_overhead": device, "padding_overhead": padded / raw - 1.0,
                    "mean_gears": float(len(gears)), "peak_bytes": held, "mean_bytes": held,
                    "changes_per_hour": 0.0}
    return best


def fitting_after_start(values: np.ndarray, early: np.ndarray, dim: Dim, line: Line,
                        budget: float | None, capture: float, workers: int = 1) -> float:
    """The device overhead of a clairvoyant at equal memory that starts as the adaptive modes
    do: on the start-up gears (each captured the first time traffic reaches it, the largest at
    once) for the `early` events (those before the first decision round), then on the
    padding-optimal static set of 1 to MOST_GEARS gears of the whole trace whose graphs fit
    `budget`, the best of them, capturing those of its gears not captured yet. What knowing
    the whole trace from the first round on would give, within the bound, start-up paid."""
    start = dim.initial_gears
    held = {*reached(dim, values[early], (start,), np.array([early.sum()])), start[-1]}
    head = float(padded_cost(dim, start, values[early]).sum())
    raw = float(dim.work(values).sum())
    sets = optimal_sets(values, MOST_GEARS, cost=dim.work)
    best = np.inf
    for k in range(1, sets.costs.size + 1):
        gears = sets.gears(k)
        if budget is not None and k > 1 and float(
                line(np.asarray(gears, float)).sum()) * workers > budget:
            continue
        tail = float(padded_cost(dim, gears, values[~early]).sum())
        best = min(best, (head + tail + capture * workers * len(held | set(gears))) / raw - 1.0)
    return float(best)
