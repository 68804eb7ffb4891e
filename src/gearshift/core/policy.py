"""The gear policy: a pure function of gears, statistics, memory and time.

One round per profile: each dim is decided on its own, by the rules of `config.policy_mode`:
"plan" moves the gears toward the padded-work optimum of the decayed histogram
(`gearshift.core.planner`), "rules" applies the original rules one by one
(`gearshift.core.rules`). No clock, I/O, threads or torch; docs/policy.md gives the rules and
where they come from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from gearshift.core.config import PolicyConfig
from gearshift.core.costs import Prices, spent
from gearshift.core.dims import Dim
from gearshift.core.gears import Decision, DimGears, GearChange, apply
from gearshift.core.planner import plan_steps
from gearshift.core.rules import rules_round
from gearshift.core.stats import Histogram


def memory_pressure(memory_usage: float | None, config: PolicyConfig) -> bool:
    """Usage at or over the threshold; never when either is None."""
    limit = config.device_memory_usage_threshold_ratio
    return memory_usage is not None and limit is not None and memory_usage >= limit


def should_update(last_update: float | None, now: float, memory_usage: float | None,
                  config: PolicyConfig) -> str | None:
    """Why a round is due now: "interval" (never run, or the interval elapsed), "memory"
    (pressure, before the interval), or None."""
    if last_update is None or now - last_update >= config.update_interval_seconds:
        return "interval"
    return "memory" if memory_pressure(memory_usage, config) else None


def decide(dims: Mapping[str, Dim], gears: Mapping[str, DimGears],
           stats: Mapping[str, Histogram], memory_usage: float | None, now: float,
           config: PolicyConfig, history: Mapping[str, Histogram] | None = None,
           prices: Mapping[str, Prices] | None = None) -> Decision:
    """One decision round for one profile; dims are decided independently.
    `history` holds the plan's longer horizon of each dim (`PolicyConfig.history`), which plan
    mode blends into the window's; without it, plan mode reads the window alone. A dim with
    `prices` is decided priced in plan mode (`planner.plan_steps`); rules mode ignores them.
    The bytes headroom is the profile's: each dim gets what the dims before it left.
    A dim whose window holds fewer than `min_window_events` events keeps its gears (no
    addition, eviction or protection) unless memory pressure calls for a round."""
    pressure = memory_pressure(memory_usage, config)
    new_gears: dict[str, DimGears] = {}
    changes: list[GearChange] = []
    note = (f"; memory pressure {memory_usage:.2f} >= "
            f"{config.device_memory_usage_threshold_ratio}" if pressure else "")
    prices = dict(prices or {})
    for name, dim in dims.items():
        state, hist = gears[name], stats.get(name, Histogram.empty())
        if hist.total_count < config.min_window_events and not pressure:
            new_gears[name] = state  # too little evidence yet: the gears stay as they are
            continue
        if config.policy_mode == "plan":
            priced = prices.get(name)
            out = [GearChange(name, g, action, why + note)
                   for action, g, why in plan_steps(dim, state, hist, pressure, now, config,
                                                    (history or {}).get(name), priced)]
            new_gears[name] = apply(state, out, now, config, cooling=True)
            if priced is not None and priced.headroom is not None:  # the next dims get less
                left = priced.headroom - spent({name: priced}, gears, new_gears)
                prices = {d: replace(p, headroom=left) for d, p in prices.items()}
        else:
            out = rules_round(name, dim, state, hist, pressure, note, now, config)
            new_gears[name] = apply(state, out, now, config)
        changes += out
    return Decision(new_gears, tuple(changes))
