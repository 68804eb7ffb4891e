"""Policy configuration: seed 000's keys and defaults, validated on construction.

A TOML file holds the keys at top level or under a `[policy]` table; `--set
KEY=VALUE` overrides are parsed by the field's type. `none` (or TOML `false`)
disables `device_memory_usage_threshold_ratio`. The statistics horizon and the
update interval default per `policy_mode` (`MODE_DEFAULTS`); left unset (or
`none`), they take the mode's value at construction.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from gearshift.errors import ConfigError

POLICY_MODES = ("plan", "seed")
MODE_DEFAULTS = {
    "seed": {"window_seconds": 300.0, "half_life_seconds": 150.0,
             "update_interval_seconds": 300.0, "check_interval_seconds": 60.0},
    # The planner reads more history (its placements are exact, so noise is what limits them)
    # and decides every 15 s: a burst or a drift gets its gears within seconds, and a round
    # that changes nothing costs no snapshot.
    "plan": {"window_seconds": 600.0, "half_life_seconds": 300.0,
             "update_interval_seconds": 15.0, "check_interval_seconds": 15.0},
}

HISTORY_SLICES = 60  # as many as the plan window's (600 s / 10 s): 3x the span, alike in memory

T = TypeVar("T")


@dataclass(frozen=True)
class PolicyConfig:
    """Seed 000 §4–§8 defaults; where the seed is silent, its reference implementation's.

    `policy_mode` "plan" (default) places gears at the padded-work optimum (docs/policy.md);
    "seed" is seed 000 rule by rule. The `plan_*` keys only apply to "plan";
    `plan_history_seconds` is the horizon of a second, slower histogram of the same events,
    which the plan reads beside the window's at `plan_history_weight` of its weight.
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

    def __post_init__(self) -> None:
        if self.policy_mode not in POLICY_MODES:
            raise ConfigError("policy_mode",
                              f"{self.policy_mode!r} is not one of {', '.join(POLICY_MODES)}")
        for key, value in MODE_DEFAULTS[self.policy_mode].items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)
        positive = ("window_seconds", "half_life_seconds", "slice_seconds",
                    "update_interval_seconds", "check_interval_seconds", "plan_history_seconds")
        for key in positive:
            _check(key, getattr(self, key), 0.0, math.inf, low_open=True)
        for key in ("w_h", "w_p", "w_sp", "replace_loss_threshold",
                    "pad_add_threshold", "split_add_threshold"):
            _check(key, getattr(self, key), 0.0, 1.0)
        for key in ("plan_gear_gain", "plan_gear_keep", "plan_move_gain"):
            _check(key, getattr(self, key), 0.0, 1.0)
        _check("plan_confidence", self.plan_confidence, 0.0, 100.0)
        _check("plan_history_weight", self.plan_history_weight, 0.0, 100.0)
        _check("plan_max_moves", self.plan_max_moves, 1, 10**6, integer=True)
        if self.plan_gear_keep > self.plan_gear_gain:
            raise ConfigError("plan_gear_keep", f"{self.plan_gear_keep} exceeds plan_gear_gain "
                              f"{self.plan_gear_gain} (a gear just added would be dropped)")
        _check("recent_use_protect_seconds", self.recent_use_protect_seconds, 0.0, math.inf)
        if self.device_memory_usage_threshold_ratio is not None:
            _check("device_memory_usage_threshold_ratio",
                   self.device_memory_usage_threshold_ratio, 0.0, 1.0, low_open=True)
        _check("add_min_samples", self.add_min_samples, 1, 10**9, integer=True)
        _check("min_gear_count_per_type", self.min_gear_count_per_type, 1, 10**6, integer=True)
        _check("max_gears_per_type", self.max_gears_per_type, 1, 10**6, integer=True)
        if self.max_gears_per_type < self.min_gear_count_per_type:
            raise ConfigError("max_gears_per_type",
                              f"{self.max_gears_per_type} is below min_gear_count_per_type "
                              f"{self.min_gear_count_per_type}")
        if self.slice_seconds > self.window_seconds:
            raise ConfigError("slice_seconds", f"{self.slice_seconds} exceeds window_seconds "
                              f"{self.window_seconds}")

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


def _check(key: str, value: Any, low: float, high: float, *,
           low_open: bool = False, integer: bool = False) -> None:
    kind = "an integer" if integer else "a number"
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or (not integer and math.isnan(value)):
        raise ConfigError(key, f"expected {kind}, got {value!r}")
    below = value <= low if low_open else value < low
    if below or value > high:
        bracket = "(" if low_open else "["
        raise ConfigError(key, f"{value!r} is outside {bracket}{low}, {high}]")


def from_mapping(cls: type[T], values: Mapping[str, Any]) -> T:
    """Build a config dataclass from a mapping, naming any unknown key."""
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    for key in values:
        if key not in known:
            raise ConfigError(key, f"unknown key (known: {', '.join(sorted(known))})")
    clean = {k: (None if v is False and k == "device_memory_usage_threshold_ratio" else v)
             for k, v in values.items()}
    return cls(**clean)


def parse_overrides(cls: type, overrides: Iterable[str]) -> dict[str, Any]:
    """Parse `KEY=VALUE` strings by the type of the field named KEY."""
    types = {f.name: f.type for f in fields(cls)}
    out: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError(key or item, "expected KEY=VALUE")
        if key not in types:
            raise ConfigError(key, f"unknown key (known: {', '.join(sorted(types))})")
        out[key] = _parse_value(key, str(types[key]), raw.strip())
    return out


def _parse_value(key: str, type_name: str, raw: str) -> Any:
    if "None" in type_name and raw.lower() in ("none", "null", "off", ""):
        return None
    try:
        if type_name.startswith("int"):
            return int(raw)
        if type_name.startswith("float"):
            return float(raw)
        if type_name.startswith("bool"):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1")
    except ValueError:
        raise ConfigError(key, f"cannot parse {raw!r} as {type_name}") from None
    return raw


def read_toml(path: str | Path, section: str, top_level: bool = True) -> dict[str, Any]:
    """The keys of `section` in a TOML file (or, if `top_level`, its top level when it has no
    such table)."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError("config", f"file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("config", f"{path} is not valid TOML: {e}") from None
    table = data.get(section, data if top_level else {})
    if not isinstance(table, dict):
        raise ConfigError(section, f"expected a table in {path}")
    return {k: v for k, v in table.items() if not isinstance(v, dict)}


def load_policy_config(path: str | Path | None = None,
                       overrides: Iterable[str] = ()) -> PolicyConfig:
    """PolicyConfig from defaults, then an optional TOML file, then `KEY=VALUE` overrides."""
    values: dict[str, Any] = read_toml(path, "policy") if path else {}
    values.update(parse_overrides(PolicyConfig, overrides))
    return from_mapping(PolicyConfig, values)
