"""Replay a trace through a gear policy in virtual time, as the controller would run it.

Virtual time is seconds since the trace's first event, when the controller
starts (so checks at exact multiples of `check_interval_seconds` and the first
interval-driven update one `update_interval_seconds` in). Events of each segment
between two checks run on the gears in force when it starts and are then folded
into the per-dim statistics; at the check that ends it, `should_update` (memory
reading: the last one before the check) may trigger a `decide` round whose
gears apply from the check on. Static policies replay the same segments and
never decide. The gear sets of the policies: `policy_dims`.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim, Gears, ladder, padded_cost, padded_work
from gearshift.core.group import decide_group
from gearshift.core.optimal import optimal_sets
from gearshift.core.round import DeviceLedger, ProfileLedger, decide_round
from gearshift.errors import ShapeError, TraceError
from gearshift.tools.simulated_device import PROFILE, Device
from gearshift.tools.trace import Trace

POLICIES = ("adaptive", "static", "pow2", "optimal")
SPLITTABLE = frozenset({"BATCHSIZE"})
MAX_CHECKS = 10**7  # decision checks of one replay: its segments are arrays of this length


@dataclass(frozen=True)
class Change:
    """One gear change of a decision round at check time `t`, triggered by `trigger`."""

    t: float
    trigger: str
    dim: str
    gear: int
    action: str
    reason: str


@dataclass(frozen=True)
class DimResult:
    """Work and gears of one dim; per-segment arrays align with `SimulationResult.starts`."""

    raw_work: int
    padded_work: int
    raw_cost: float
    padded_cost: float
    mean_gears: float
    split_events: int
    eager_events: int
    adds: int
    evictions: int
    gears: tuple[Gears, ...]
    segment_raw: np.ndarray
    segment_padded: np.ndarray
    captures: int = 0
    capture_seconds: float = 0.0
    segment_bytes: np.ndarray | None = None  # graph bytes held in each segment, all workers
    mean_bytes: float = 0.0  # time-weighted

    @property
    def peak_bytes(self) -> float:
        return float(self.segment_bytes.max()) if self.segment_bytes is not None else 0.0

    @property
    def padding_overhead(self) -> float:
        return self.padded_work / self.raw_work - 1.0

    @property
    def cost_overhead(self) -> float:
        """Padded over raw cost (`Dim.work`) - 1: padding_overhead with the default cost."""
        return self.padded_cost / self.raw_cost - 1.0

    @property
    def device_overhead(self) -> float:
        """(Padded cost + capture seconds) / raw cost - 1: with the cost in device seconds, what
        padding and captures together add to the raw device time."""
        return (self.padded_cost + self.capture_seconds) / self.raw_cost - 1.0

    @property
    def final_gears(self) -> Gears:
        return self.gears[-1]


@dataclass(frozen=True)
class SimulationResult:
    """One replay: `starts` are the segments' start times (seconds since the first event),
    `updates` the decision rounds run, `changes` every change they made, with its reason."""

    trace: str
    events: int
    duration: float
    updates: int
    starts: np.ndarray
    dims: dict[str, DimResult]
    changes: tuple[Change, ...]
    budget: float | None = None  # the graph memory bound the policy ran under (None: none)
    segment_buffers: np.ndarray | None = None  # static buffer bytes held in each segment

    @property
    def peak_buffers(self) -> float:
        return float(self.segment_buffers.max()) if self.segment_buffers is not None else 0.0

    @property
    def peak_bytes(self) -> float:
        """The most graph bytes all dims held at once (in any segment), on every worker."""
        return float(self._bytes().max()) if self.starts.size else 0.0

    @property
    def mean_bytes(self) -> float:
        """The graph bytes all dims held, time-weighted."""
        return float(np.average(self._bytes(), weights=self._weights()))

    def _bytes(self) -> np.ndarray:
        """Per segment, the graph bytes of every dim and the static buffers', if modelled."""
        held = sum((d.segment_bytes for d in self.dims.values() if d.segment_bytes is not None),
                   np.zeros(self.starts.size))
        return held if self.segment_buffers is None else held + self.segment_buffers

    def _weights(self) -> np.ndarray:
        return (np.diff(np.r_[self.starts, self.duration]) if self.duration > 0
                else np.ones(self.starts.size))

    def summary(self) -> dict[str, object]:
        """JSON-ready figures: per dim padding, gears, churn; every change with its reason."""
        hours = self.duration / 3600.0
        return {
            "events": self.events,
            "updates": self.updates,
            "dims": {
                name: {
                    "padding_overhead": d.padding_overhead,
                    "cost_overhead": d.cost_overhead,
                    "device_overhead": d.device_overhead,
                    "captures": d.captures,
                    "capture_seconds": d.capture_seconds,
                    "mean_gears": d.mean_gears,
                    "peak_graph_bytes": d.peak_bytes,
                    "mean_graph_bytes": d.mean_bytes,
                    "final_gears": list(d.final_gears),
                    "adds": d.adds,
                    "evictions": d.evictions,
                    "split_events": d.split_events,
                    "eager_events": d.eager_events,
                    "churn_per_hour": (d.adds + d.evictions) / hours if hours else 0.0,
                }
                for name, d in self.dims.items()
            },
            "graph_bytes": {"budget": self.budget, "peak": self.peak_bytes,
                            "mean": self.mean_bytes,
                            **({} if self.segment_buffers is None else {"buffers": {
                                "peak": self.peak_buffers, "mean": float(np.average(
                                    self.segment_buffers, weights=self._weights()))}})},
            "decisions": [vars(c) for c in self.changes],
        }


def policy_dims(
    trace: Trace,
    policy: str,
    gears: Mapping[str, Gears] | None = None,
    k: Mapping[str, int] | None = None,
    splittable: Mapping[str, bool] | None = None,
    cost: Mapping[str, Sequence[float]] | None = None,
) -> dict[str, Dim]:
    """The Dim of every trace column under `policy`; ShapeError on misuse.

    Bounds `[1, M]`, M the column's largest value (the tightest server limit the trace admits;
    or the largest given gear, if larger); default gears (adaptive, static): the Dim's default
    ladder `ladder(1, M)`, the powers of two below M, plus M. `pow2`: that ladder, always (the
    power-of-two expansion of `[1, M]` as the reference implementation makes it, ending at M
    as the adaptive start does); `optimal`: the hindsight-optimal K gears of the column
    (default K: as many as the ladder holds).
    `BATCHSIZE` is splittable, other dims not. `cost` sets a dim's `Dim.cost`: the policy, and
    the optimum, minimise padded cost."""
    gears, k, splittable = dict(gears or {}), dict(k or {}), dict(splittable or {})
    cost = dict(cost or {})
    if policy not in POLICIES:
        raise ShapeError(f"unknown policy {policy!r} (one of {', '.join(POLICIES)})")
    for option, given in (("gears", gears), ("k", k), ("splittable", splittable), ("cost", cost)):
        unknown = set(given) - set(trace.dims)
        if unknown:
            raise ShapeError(
                f"{option}: unknown dim {', '.join(sorted(unknown))} "
                f"(the trace has {', '.join(trace.dims)})"
            )
    if gears and policy not in ("adaptive", "static"):
        raise ShapeError(f"gears: not used by policy {policy} (only adaptive, static)")
    if k and policy != "optimal":
        raise ShapeError(f"k: only used by policy optimal, not {policy}")
    out = {}
    for name, values in trace.dims.items():
        peak = int(values.max())
        initial = gears.get(name) or ladder(1, peak)
        priced = Dim(cost=cost.get(name, Dim.cost))
        if policy == "optimal":
            count = k.get(name, len(ladder(1, peak)))
            initial = optimal_sets(values, count, cost=priced.work).gears(count)
        split = splittable.get(name, name in SPLITTABLE)
        out[name] = Dim(gears=initial, max=max(peak, *initial), splittable=split, cost=priced.cost)
    return out


def simulate(
    trace: Trace, dims: Mapping[str, Dim], config: PolicyConfig, *, adaptive: bool = True,
    device: Device | None = None, ranks: int = 1,
) -> SimulationResult:
    """Replay `trace` (every column a dim of `dims`) through the policy, or static gears, on
    `device` (default: captures free, unpriced); `ranks` > 1: as one group of that many ranks,
    each on a device alike, every rank seeing every step, decided by `core.group.decide_group`
    as the controller decides a group."""
    device = device or Device()
    prices = device.prices(dims)
    t = trace.t - trace.t[0]
    end = float(t[-1])
    interval = config.check_interval_seconds
    if end / interval > MAX_CHECKS:
        raise TraceError(f"{trace.name}: {end:.3g} s of trace is over {MAX_CHECKS:,} checks of "
                         f"{interval:g} s (raise check_interval_seconds, or cut the trace)")
    checks = interval * np.arange(1, int(end // interval) + 1)
    cuts = np.r_[0, np.searchsorted(t, checks, side="left"), t.size]
    starts = np.r_[0.0, checks]
    current = {name: dim.initial_gears for name, dim in dims.items()}
    group = "group" if ranks > 1 else None
    ledgers = [DeviceLedger(last_update=0.0, memory_bytes=device.memory, profiles={
        PROFILE: replace(ProfileLedger.new(dims, 0.0, config), group=group)})
        for _ in range(ranks)]
    ledger = ledgers[0]
    gears = {name: [] for name in dims}
    raw = {name: np.zeros(starts.size, dtype=np.int64) for name in dims}
    padded = {name: np.zeros(starts.size, dtype=np.int64) for name in dims}
    costs = {name: np.zeros(starts.size) for name in dims}
    changes: list[Change] = []
    updates = 0
    for seg, (lo, hi) in enumerate(itertools.pairwise(cuts)):
        for name, dim in dims.items():
            values = trace.dims[name][lo:hi]
            gears[name].append(current[name])
            raw[name][seg] = values.sum()
            padded[name][seg] = padded_work(current[name], values, dim.splittable).sum()
            costs[name][seg] = padded_cost(dim, current[name], values).sum()
            for each in ledgers if adaptive else ():  # each rank records what it serves
                each.profiles[PROFILE].stats[name].fold(t[lo:hi], values)
        if seg == checks.size or not adaptive:
            continue
        now = float(checks[seg])
        mem = None if trace.mem_usage is None or hi == 0 else float(trace.mem_usage[hi - 1])
        round = decide_round(ledger, now, mem, config, prices=prices) if group is None else \
            decide_group(PROFILE, ledgers, 0, ledger.last_update, now, mem, config,
                         [prices or {}] * ranks)
        if round is None:
            continue
        for each in ledgers:
            each.profiles[PROFILE].gears = round.gears[PROFILE]
            each.last_update = now
        updates += 1
        current = {name: g.gears for name, g in round.gears[PROFILE].items()}
        changes += [Change(now, round.trigger, c.dim, c.gear, c.action, c.reason)
                    for c in round.changes[PROFILE]]
    weights = np.diff(np.r_[starts, end]) if end > 0 else np.ones(starts.size)
    sizes = np.diff(cuts)
    dim_results = {
        name: _dim_result(
            name, trace.dims[name], dim, tuple(gears[name]), sizes, weights, raw[name],
            padded[name], float(costs[name].sum()), [c.action for c in changes if c.dim == name],
            [c.gear for c in changes if c.dim == name and c.action == "add"], device,
            reached(dim, trace.dims[name], tuple(gears[name]), sizes) if device.lazy
            else dict.fromkeys(dim.initial_gears, 0))
        for name, dim in dims.items()
    }
    buffers = None if not device.buffers else np.array(
        [device.buffer_bytes(dims, {d: gears[d][i][-1] for d in dims})
         for i in range(starts.size)])
    return SimulationResult(trace.name, t.size, end, updates, starts, dim_results, tuple(changes),
                            device.budget(dims, config) if adaptive else None, buffers)


def _dim_result(
    name: str,
    values: np.ndarray,
    dim: Dim,
    gears: tuple[Gears, ...],
    sizes: np.ndarray,
    weights: np.ndarray,
    raw: np.ndarray,
    padded: np.ndarray,
    padded_cost: float,
    actions: list[str],
    added: list[int],
    device: Device,
    start: dict[int, int],
) -> DimResult:
    """Totals of one dim from its per-segment gears (`sizes` events each) and work; the gears
    `added` and the initial ones (`start`: gear -> the segment it was captured in) each
    captured once per worker. Mean gears count graphs held: an initial gear from its capture
    on (with lazy captures, one never reached counts for nothing), and so do graph bytes."""
    over = int((values > np.repeat([g[-1] for g in gears], sizes)).sum())
    waiting = set(dim.initial_gears) - set(start)  # never captured
    held = [[x for x in g if x not in waiting and start.get(x, -1) <= i]
            for i, g in enumerate(gears)]
    captured = [*start, *added]
    line = device.graph_bytes(name)
    held_bytes = np.array([float(line(np.asarray(h, float)).sum()) for h in held]) * device.workers
    return DimResult(
        raw_work=int(raw.sum()),
        padded_work=int(padded.sum()),
        raw_cost=float(dim.work(values).sum()),
        padded_cost=padded_cost,
        mean_gears=float(np.average([len(h) for h in held], weights=weights)),
        split_events=over if dim.splittable else 0,
        eager_events=0 if dim.splittable else over,
        adds=actions.count("add"),
        evictions=actions.count("evict"),
        gears=gears,
        segment_raw=raw,
        segment_padded=padded,
        captures=len(captured),
        capture_seconds=device.seconds(captured),
        segment_bytes=held_bytes,
        mean_bytes=float(np.average(held_bytes, weights=weights)),
    )


def reached(dim: Dim, values: np.ndarray, gears: tuple[Gears, ...],
             sizes: np.ndarray) -> dict[int, int]:
    """The initial gears some event ran on while they were held since the start, each with
    the segment where that first happened."""
    initial, reached = set(dim.initial_gears), {}
    for i, (held, run) in enumerate(zip(gears, np.split(values, np.cumsum(sizes)[:-1]),
                                        strict=True)):
        initial &= set(held)
        if not initial or not run.size:
            if not initial:
                break
            continue
        g = np.asarray(held, np.int64)
        used = g[np.unique(np.searchsorted(g, run[run <= g[-1]]))]  # over the top: eager
        if dim.splittable and (run > g[-1]).any():  # or split: top chunks and a tail
            rest = run[run > g[-1]] % g[-1]
            used = np.r_[used, g[-1], g[np.searchsorted(g, rest[rest > 0])]]
        for g in initial & set(used.tolist()):
            reached.setdefault(g, i)
    return reached


def odd_runs(trace: Trace, result: SimulationResult, dim: str) -> tuple[np.ndarray,
                                                                         list[np.ndarray]]:
    """The odd events' indices, and their values of `dim` cut by `result`'s segments
    (`segment_runs`)."""
    odd = np.arange(1, trace.dims[dim].size, 2)
    return odd, segment_runs(trace, result, dim, odd)


def segment_runs(trace: Trace, result: SimulationResult, dim: str,
                 picked: np.ndarray) -> list[np.ndarray]:
    """The values of `dim` of the events `picked` (ascending indices) cut by `result`'s
    segments: one run per segment, each ran on that segment's gears."""
    seg = np.searchsorted(result.starts, trace.t[picked] - trace.t[0], "right") - 1
    return np.split(trace.dims[dim][picked], np.searchsorted(seg, np.arange(1, len(result.starts))))
