"""Policy configuration: every key with its default, validated on construction.

`None` disables `device_memory_usage_threshold_ratio`. The statistics horizon and the update
interval default per `policy_mode` (`MODE_DEFAULTS`); left unset, they take the mode's value
at construction. Every duration is finite (at most MAX_SECONDS), and the statistics it sizes
stay bounded: a window holds at most MAX_SLICES slices, and a slice at most
MAX_SLICE_HALF_LIVES half-lives (an event's weight within a slice then stays far from
overflowing). Reading it from files and `KEY=VALUE` strings is `gearshift.configfile`'s.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any

from gearshift.errors import ConfigError

POLICY_MODES = ("plan", "rules")
RENAMED_MODES = {"seed": "rules"}  # refused, naming the new value
MODE_DEFAULTS = {
    "rules": {"window_seconds": 300.0, "half_life_seconds": 150.0,
              "update_interval_seconds": 300.0, "check_interval_seconds": 60.0},
    # The planner reads more history (its placements are exact, so noise is what limits them)
    # and decides every 15 s: a burst or a drift gets its gears within seconds, and a round
    # that changes nothing costs no snapshot.
    "plan": {"window_seconds": 600.0, "half_life_seconds": 300.0,
             "update_interval_seconds": 15.0, "check_interval_seconds": 15.0},
}

HISTORY_SLICES = 60  # as many as the plan window's (600 s / 10 s): 3x the span, alike in memory
MAX_SECONDS = 1e8  # every duration (about 3 years)
MAX_SLICES = 1024  # window_seconds / slice_seconds
MAX_SLICE_HALF_LIVES = 64  # slice_seconds / half_life_seconds
MAX_BYTES = float(1 << 50)  # graph_memory_budget_bytes: a petabyte
MAX_RATIO = 1e6  # graph_memory_budget_ratio


@dataclass(frozen=True)
class PolicyConfig:
    """The original policy's defaults (docs/policy.md, "Configuration"); where its rules are
    silent, its reference implementation's.

    `policy_mode` "plan" (default) places gears at the padded-work optimum (docs/policy.md);
    "rules" applies the original rules one by one. The `plan_*` keys only apply to "plan";
    `plan_history_seconds` is the horizon of a second, slower histogram of the same events,
    which the plan reads beside the window's at `plan_history_weight` of its weight. Priced
    (measured costs given), a gear added must save its captures within `plan_payback_seconds`
    of device time at the traffic's rate, and the graphs of a device stay within its bound:
    `graph_memory_budget_bytes`, else `graph_memory_budget_ratio` times the bytes of its
    start-up gears, never under `graph_memory_floor_ratio` of the device's memory
    (`core.memory`; both None: no bound; the usage threshold applies either way).
    A dim's gears change only once its window holds `min_window_events` events, or under
    memory pressure.
    """

    window_seconds: float | None = None
    half_life_seconds: float | None = None
    slice_seconds: float = 10.0
    w_h: float = 0.60
    w_p: float = 0.20
    w_sp: float = 0.20
    update_interval_seconds: float | None = None
    check_interval_seconds: float | None = None
    device_memory_usage_threshold_ratio: float | None = 0.90
    recent_use_protect_seconds: float = 300.0
    replace_loss_threshold: float = 0.60
    pad_add_threshold: float = 0.35
    split_add_threshold: float = 0.20
    add_min_samples: int = 5
    min_window_events: int = 5
    min_gear_count_per_type: int = 1
    max_gears_per_type: int = 64
    policy_mode: str = "plan"
    plan_gear_gain: float = 0.035
    plan_gear_keep: float = 0.0125
    plan_move_gain: float = 0.002
    plan_confidence: float = 1.0
    plan_max_moves: int = 4
    plan_history_seconds: float = 1800.0
    plan_history_weight: float = 0.5
    plan_payback_seconds: float = 1800.0
    graph_memory_budget_bytes: float | None = None
    graph_memory_budget_ratio: float | None = 1.25
    graph_memory_floor_ratio: float | None = 0.005

    def __post_init__(self) -> None:
        if self.policy_mode in RENAMED_MODES:
            raise ConfigError("policy_mode", f"{self.policy_mode!r} was renamed"
                              f" {RENAMED_MODES[self.policy_mode]!r}")
        if self.policy_mode not in POLICY_MODES:
            raise ConfigError("policy_mode",
                              f"{self.policy_mode!r} is not one of {', '.join(POLICY_MODES)}")
        for key, value in MODE_DEFAULTS[self.policy_mode].items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)
        positive = ("window_seconds", "half_life_seconds", "slice_seconds",
                    "update_interval_seconds", "check_interval_seconds", "plan_history_seconds",
                    "plan_payback_seconds")
        for key in positive:
            check_value(key, getattr(self, key), 0.0, MAX_SECONDS, low_open=True)
        for key in ("w_h", "w_p", "w_sp", "replace_loss_threshold",
                    "pad_add_threshold", "split_add_threshold"):
            check_value(key, getattr(self, key), 0.0, 1.0)
        for key in ("plan_gear_gain", "plan_gear_keep", "plan_move_gain"):
            check_value(key, getattr(self, key), 0.0, 1.0)
        check_value("plan_confidence", self.plan_confidence, 0.0, 100.0)
        check_value("plan_history_weight", self.plan_history_weight, 0.0, 100.0)
        check_value("plan_max_moves", self.plan_max_moves, 1, 10**6, integer=True)
        if self.plan_gear_keep > self.plan_gear_gain:
            raise ConfigError("plan_gear_keep", f"{self.plan_gear_keep} exceeds plan_gear_gain "
                              f"{self.plan_gear_gain} (a gear just added would be dropped)")
        check_value("recent_use_protect_seconds", self.recent_use_protect_seconds, 0.0,
                    MAX_SECONDS)
        if self.graph_memory_budget_bytes is not None:
            check_value("graph_memory_budget_bytes", self.graph_memory_budget_bytes, 0.0,
                        MAX_BYTES, low_open=True)
        if self.graph_memory_budget_ratio is not None:
            check_value("graph_memory_budget_ratio", self.graph_memory_budget_ratio, 0.0,
                        MAX_RATIO, low_open=True)
        if self.graph_memory_floor_ratio is not None:
            check_value("graph_memory_floor_ratio", self.graph_memory_floor_ratio, 0.0, 1.0)
        if self.device_memory_usage_threshold_ratio is not None:
            check_value("device_memory_usage_threshold_ratio",
                   self.device_memory_usage_threshold_ratio, 0.0, 1.0, low_open=True)
        check_value("add_min_samples", self.add_min_samples, 1, 10**9, integer=True)
        check_value("min_window_events", self.min_window_events, 1, 10**9, integer=True)
        check_value("min_gear_count_per_type", self.min_gear_count_per_type, 1, 10**6, integer=True)
        check_value("max_gears_per_type", self.max_gears_per_type, 1, 10**6, integer=True)
        if self.max_gears_per_type < self.min_gear_count_per_type:
            raise ConfigError("max_gears_per_type",
                              f"{self.max_gears_per_type} is below min_gear_count_per_type "
                              f"{self.min_gear_count_per_type}")
        if self.slice_seconds > self.window_seconds:
            raise ConfigError("slice_seconds", f"{self.slice_seconds} exceeds window_seconds "
                              f"{self.window_seconds}")
        if self.window_seconds > MAX_SLICES * self.slice_seconds:
            raise ConfigError("slice_seconds", f"{self.slice_seconds} cuts window_seconds "
                              f"{self.window_seconds} into over {MAX_SLICES} slices")
        if self.slice_seconds > MAX_SLICE_HALF_LIVES * self.half_life_seconds:
            raise ConfigError("half_life_seconds", f"{self.half_life_seconds} is under 1/"
                              f"{MAX_SLICE_HALF_LIVES} of slice_seconds {self.slice_seconds}")

    def history(self) -> PolicyConfig:
        """The statistics settings of the plan's history: `plan_history_seconds` of window,
        half of it as half-life, in HISTORY_SLICES slices."""
        window = self.plan_history_seconds
        return dataclasses.replace(self, window_seconds=window, half_life_seconds=window / 2,
                                   slice_seconds=window / HISTORY_SLICES)

    def scaled(self, factor: float) -> PolicyConfig:
        """Every duration divided by `factor` (time compression for demos and tests)."""
        durations = {f.name: getattr(self, f.name) / factor for f in fields(self)
                     if f.name.endswith("_seconds")}
        return dataclasses.replace(self, **durations)


def check_value(key: str, value: Any, low: float, high: float, *,
           low_open: bool = False, integer: bool = False) -> None:
    kind = "an integer" if integer else "a number"
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or (not integer and math.isnan(value)):
        raise ConfigError(key, f"expected {kind}, got {value!r}")
    below = value <= low if low_open else value < low
    if below or value > high:
        bracket = "(" if low_open else "["
        raise ConfigError(key, f"{value!r} is outside {bracket}{low}, {high}]")
