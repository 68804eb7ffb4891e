"""`gearshift simulate --fleet N`: a trace split across N nodes that join at staggered times,
sharing what they learn as a fleet store would (`core.fleet`), in virtual time.

Node i joins at i × `stagger` seconds; a router sends each event to one of the nodes joined by
then, in turn. The trace is repeated end to end (times shifted) until the last node has run
an hour. Every node runs the controller's round (`core.round.decide_round`) every check
interval on its own events, and publishes every `publish` seconds what a node publishes
(per dim its gears and its window's and history's `Compact` statistics). A node reads, at its
join and after each of its publishes, the latest publish of every node that joined before it
and published within `ttl`: its start-up gears are `core.fleet.fleet_gears` of them and its
rounds add their prior (`core.fleet.prior_of`, `primed`). The first node starts cold (the
ladder). The last node runs twice on the same events: with the fleet, and cold; the other
nodes never read it, so both runs see the same fleet. Captures cost `device.capture` on each
worker: a node's start-up gears at its join, each added gear when added.

Figures (`FleetResult.summary`): for the last node, its first decision interval's cost
overhead (padded / raw cost - 1) and its first hour's device overhead ((padded cost + capture
seconds) / raw cost - 1), with the fleet and cold, next to the fleet's steady state: the other
nodes' overheads over the same hour.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim, padded_cost
from gearshift.core.fleet import Compact, Member, Prior, fleet_gears, primed, prior_of
from gearshift.core.round import DeviceLedger, ProfileLedger, decide_round
from gearshift.errors import ShapeError
from gearshift.tools.simulate import PROFILE, Device
from gearshift.tools.trace import Trace

HOUR = 3600.0


@dataclass
class NodeRun:
    """One node's replay: per segment (a check interval from `starts[i]`) the raw and padded
    cost of its events and the capture seconds spent; its publishes (time, member)."""

    name: str
    join: float
    starts: np.ndarray
    raw: np.ndarray
    padded: np.ndarray
    captures: np.ndarray
    start_gears: dict[str, tuple[int, ...]]
    published: list[tuple[float, Member]] = field(default_factory=list)

    def overhead(self, lo: float, hi: float, captures: bool = True) -> float:
        """(Padded cost [+ capture seconds]) / raw cost - 1 over the segments starting in
        [lo, hi)."""
        m = (self.starts >= lo) & (self.starts < hi)
        raw = float(self.raw[m].sum())
        spent = float(self.padded[m].sum()) + (float(self.captures[m].sum()) if captures else 0)
        return spent / raw - 1.0 if raw > 0 else math.nan


def tiled(trace: Trace, seconds: float) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The trace's times (from 0) and values, repeated end to end to cover `seconds`."""
    t = trace.t - trace.t[0]
    period = float(t[-1]) + (float(np.diff(t).mean()) if t.size > 1 else 1.0)
    copies = max(1, math.ceil(seconds / period))
    times = np.concatenate([t + i * period for i in range(copies)])
    return times, {d: np.tile(v, copies) for d, v in trace.dims.items()}


def _read(fleet: list[NodeRun], now: float, ttl: float) -> list[Member]:
    """The latest publish of each node in `fleet` at `now`, within `ttl`, as read then."""
    out = []
    for node in fleet:
        seen = [(t, m) for t, m in node.published if t <= now]
        if seen and now - seen[-1][0] <= ttl:
            t, m = seen[-1]
            out.append(dataclasses.replace(m, elapsed=now - t))
    return out


def run_node(name: str, times: np.ndarray, values: Mapping[str, np.ndarray],
             dims: Mapping[str, Dim], config: PolicyConfig, device: Device, join: float,
             end: float, publish: float, ttl: float, fleet: list[NodeRun] | None) -> NodeRun:
    """Replay one node's events (`times`, `values`) from `join` to `end`; `fleet`: the nodes
    it reads (None: cold, and it reads none)."""
    members = _read(fleet, join, ttl) if fleet is not None else []
    seeded = fleet_gears(members, dims, config.max_gears_per_type)
    start = {d: dim for d, dim in dims.items()}
    if seeded:
        try:
            start = {d: dataclasses.replace(dim, gears=seeded[d]) for d, dim in dims.items()}
        except ShapeError:
            start = dict(dims)
    prior: Prior | None = prior_of(members, join, config)
    ledger = DeviceLedger(last_update=join,
                          profiles={PROFILE: ProfileLedger.new(start, join, config)})
    p = ledger.profiles[PROFILE]
    interval = config.check_interval_seconds
    starts = np.arange(join, end, interval)
    cuts = np.searchsorted(times, np.r_[starts, end], side="left")
    raw, padded, captures = (np.zeros(starts.size) for _ in range(3))
    captures[0] = sum(device.seconds(dim.initial_gears) for dim in start.values())
    prices = device.prices(dims)
    run = NodeRun(name, join, starts, raw, padded, captures,
                  {d: tuple(dim.initial_gears) for d, dim in start.items()})
    next_publish = join + publish
    for seg, (lo, hi) in enumerate(itertools.pairwise(cuts)):
        for d, dim in dims.items():
            v = values[d][lo:hi]
            raw[seg] += float(dim.work(v).sum())
            padded[seg] += float(padded_cost(dim, p.gears[d].gears, v).sum())
            p.stats[d].fold(times[lo:hi], v)
        now = float(starts[seg] + interval)
        views = primed(prior, join, now, config, dims) if prior is not None else {}
        round = decide_round(ledger, now, None, config, prices=prices,
                             prior={PROFILE: views} if views else None)
        if round is not None:
            added = [c.gear for c in round.changes[PROFILE] if c.action == "add"]
            if seg + 1 < starts.size:
                captures[seg + 1] += device.seconds(added)
            ledger.apply(round)
        if now >= next_publish:
            next_publish = now + publish
            run.published.append((now, Member(name, 0.0, p.gear_lists(), {
                d: Compact.of(s.view(now), now) for d, s in p.stats.items()}, {
                d: Compact.of(s.view(now), now) for d, s in p.history.items()})))
            if fleet is not None:
                members = _read(fleet, now, ttl)
                prior = prior_of(members, now, config) or prior
    return run


@dataclass(frozen=True)
class FleetResult:
    """The nodes' runs (the last one with the fleet) and the last node's cold run."""

    trace: str
    config: PolicyConfig
    nodes: tuple[NodeRun, ...]
    cold: NodeRun
    hour: float = HOUR  # what "first hour" spans (shorter in tests)

    def summary(self) -> dict[str, object]:
        late, cold, early = self.nodes[-1], self.cold, self.nodes[:-1]
        lo, first = late.join, late.join + self.config.check_interval_seconds
        hour = lo + self.hour

        def steady(hi: float, captures: bool) -> float:
            raw = sum(float(n.raw[(n.starts >= lo) & (n.starts < hi)].sum()) for n in early)
            spent = sum(float(n.padded[(n.starts >= lo) & (n.starts < hi)].sum())
                        + (float(n.captures[(n.starts >= lo) & (n.starts < hi)].sum())
                           if captures else 0.0) for n in early)
            return spent / raw - 1.0 if raw > 0 else math.nan

        steady_first, steady_hour = steady(hour, False), steady(hour, True)
        window = lo + self.config.window_seconds
        with_fleet = late.overhead(lo, first, captures=False)
        return {
            "trace": self.trace, "nodes": len(self.nodes),
            "joins": [n.join for n in self.nodes],
            "late_node": {
                "start_gears": {"fleet": late.start_gears, "cold": cold.start_gears},
                "first_interval_cost_overhead": {"fleet": with_fleet,
                                                 "cold": cold.overhead(lo, first, False)},
                "first_window_cost_overhead": {"fleet": late.overhead(lo, window, False),
                                               "cold": cold.overhead(lo, window, False)},
                "first_hour_device_overhead": {"fleet": late.overhead(lo, hour),
                                               "cold": cold.overhead(lo, hour)},
                "first_hour_capture_seconds": {
                    "fleet": float(late.captures[late.starts < hour].sum()),
                    "cold": float(cold.captures[cold.starts < hour].sum())},
            },
            "steady_state": {"cost_overhead": steady_first, "device_overhead": steady_hour,
                             "first_window_cost_overhead": steady(window, False)},
            "first_interval_within_10_percent": bool(with_fleet <= 1.1 * steady_first + 1e-12),
        }


def simulate_fleet(trace: Trace, dims: Mapping[str, Dim], config: PolicyConfig, nodes: int,
                   device: Device | None = None, stagger: float = 600.0,
                   publish: float = 60.0, ttl: float = 600.0, hour: float = HOUR) -> FleetResult:
    """Replay `trace` across `nodes` nodes (module docstring); the last one runs `hour`."""
    if nodes < 2:
        raise ShapeError(f"a fleet needs 2 nodes or more, got {nodes}")
    device = device or Device()
    joins = np.arange(nodes) * stagger
    end = float(joins[-1]) + hour
    times, values = tiled(trace, end)
    keep = times < end
    times, values = times[keep], {d: v[keep] for d, v in values.items()}
    live = np.searchsorted(joins, times, side="right")
    node_of = np.arange(times.size) % live
    runs: list[NodeRun] = []
    cold = None
    for i in range(nodes):
        mine = node_of == i
        t, v = times[mine], {d: x[mine] for d, x in values.items()}
        args = (t, v, dims, config, device, float(joins[i]), end, publish, ttl)
        runs.append(run_node(f"node{i}", *args, fleet=list(runs) if i else None))
        if i == nodes - 1:
            cold = run_node(f"node{i}-cold", *args, fleet=None)
    assert cold is not None
    return FleetResult(trace.name, config, tuple(runs), cold, hour)


def report(trace: Trace, dims: Mapping[str, Dim], config: PolicyConfig, nodes: int,
           device: Device, policy: str, as_json: bool) -> str:
    """`gearshift simulate --fleet N`'s output: `FleetResult.summary` as JSON or a table."""
    if policy != "adaptive":
        raise ShapeError(f"--fleet replays the adaptive policy, not {policy}")
    s = simulate_fleet(trace, dims, config, nodes, device).summary()
    if as_json:
        return json.dumps(s)
    late, steady = s["late_node"], s["steady_state"]
    rows = [("first interval, cost", "first_interval_cost_overhead", "cost_overhead"),
            ("first window, cost", "first_window_cost_overhead", "first_window_cost_overhead"),
            ("first hour, device", "first_hour_device_overhead", "device_overhead")]
    lines = [f"{s['trace']}: {nodes} nodes joining at {', '.join(f'{j:g}' for j in s['joins'])}"
             " s; the last node's overhead (%):",
             f"{'':<22}{'with fleet':>12}{'cold':>10}{'fleet steady':>14}"]
    for label, key, ref in rows:
        lines.append(f"{label:<22}{100 * late[key]['fleet']:>12.1f}{100 * late[key]['cold']:>10.1f}"
                     f"{100 * steady[ref]:>14.1f}")
    lines.append(f"start-up gears: {late['start_gears']['fleet']} with the fleet, "
                 f"{late['start_gears']['cold']} cold; first interval within 10 % of steady: "
                 f"{'yes' if s['first_interval_within_10_percent'] else 'no'}")
    return "\n".join(lines)
