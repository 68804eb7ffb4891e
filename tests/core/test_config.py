"""PolicyConfig: rules mode's defaults, validation naming the key, TOML and KEY=VALUE overrides."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from gearshift.configfile import from_mapping, load_policy_config, parse_overrides
from gearshift.core.config import PolicyConfig
from gearshift.errors import ConfigError


def test_rules_mode_defaults():
    c = PolicyConfig(policy_mode="rules")
    assert (c.window_seconds, c.half_life_seconds) == (300.0, 150.0)
    assert (c.w_h, c.w_p, c.w_sp) == (0.60, 0.20, 0.20)
    assert (c.update_interval_seconds, c.check_interval_seconds) == (300.0, 60.0)
    assert c.device_memory_usage_threshold_ratio == 0.90
    assert c.recent_use_protect_seconds == 300.0
    assert (c.replace_loss_threshold, c.pad_add_threshold, c.split_add_threshold) == (
        0.60, 0.35, 0.20)
    assert (c.add_min_samples, c.min_gear_count_per_type, c.max_gears_per_type) == (5, 1, 64)
    assert c.policy_mode == "rules"


def test_plan_is_the_default_mode_with_its_own_horizon_and_cadence():
    c = PolicyConfig()
    assert c.policy_mode == "plan"
    assert (c.window_seconds, c.half_life_seconds) == (600.0, 300.0)
    assert (c.update_interval_seconds, c.check_interval_seconds) == (15.0, 15.0)
    rules = PolicyConfig(policy_mode="rules")
    assert (rules.update_interval_seconds, rules.check_interval_seconds) == (300.0, 60.0)
    assert (c.plan_gear_gain, c.plan_gear_keep, c.plan_move_gain) == (0.035, 0.0125, 0.002)
    assert (c.plan_confidence, c.plan_max_moves) == (1.0, 4)
    assert (c.plan_history_seconds, c.plan_history_weight) == (1800.0, 0.5)
    h = c.history()
    assert (h.window_seconds, h.half_life_seconds, h.slice_seconds) == (1800.0, 900.0, 30.0)
    assert c.scaled(60.0).history().window_seconds == 30.0  # compressed with the rest
    assert PolicyConfig(window_seconds=900.0).window_seconds == 900.0  # set beats the mode
    assert load_policy_config(None, ["window_seconds=none"]).window_seconds == 600.0


@pytest.mark.parametrize(("key", "value", "message"), [
    ("window_seconds", 0.0, r"outside \(0.0, 100000000.0\]"),
    ("window_seconds", float("inf"), "outside"),
    ("plan_history_seconds", float("inf"), "outside"),
    ("recent_use_protect_seconds", float("inf"), "outside"),
    ("update_interval_seconds", 1e300, "outside"),
    ("slice_seconds", 0.001, "over 1024 slices"),
    ("half_life_seconds", 0.01, "under 1/64 of slice_seconds"),
    ("half_life_seconds", -1.0, "outside"),
    ("slice_seconds", 700.0, "exceeds window_seconds"),
    ("w_h", 1.5, r"outside \[0.0, 1.0\]"),
    ("pad_add_threshold", -0.1, "outside"),
    ("replace_loss_threshold", float("nan"), "expected a number"),
    ("device_memory_usage_threshold_ratio", 0.0, r"outside \(0.0, 1.0\]"),
    ("recent_use_protect_seconds", -5.0, "outside"),
    ("add_min_samples", 0, "outside"),
    ("add_min_samples", 2.5, "expected an integer"),
    ("min_window_events", 0, "outside"),
    ("min_window_events", 1.5, "expected an integer"),
    ("min_gear_count_per_type", True, "expected an integer"),
    ("max_gears_per_type", 0, "outside"),
    ("policy_mode", "fancy", "not one of plan, rules"),
    ("policy_mode", "seed", "'seed' was renamed 'rules'"),
    ("plan_gear_gain", 1.5, "outside"),
    ("plan_gear_keep", 0.05, "exceeds plan_gear_gain"),
    ("plan_move_gain", -0.1, "outside"),
    ("plan_confidence", float("nan"), "expected a number"),
    ("plan_max_moves", 0, "outside"),
    ("plan_history_seconds", 0.0, "outside"),
    ("plan_history_weight", -0.5, "outside"),
    ("w_p", "0.2", "expected a number"),
])
def test_invalid_values_are_rejected_naming_the_key(key, value, message):
    with pytest.raises(ConfigError, match=message) as e:
        PolicyConfig(**{key: value})
    assert e.value.key == key
    assert str(e.value).startswith(f"{key}: ")
    assert isinstance(e.value, ValueError)


def test_cap_below_the_minimum_is_rejected():
    with pytest.raises(ConfigError, match="below min_gear_count_per_type") as e:
        PolicyConfig(min_gear_count_per_type=4, max_gears_per_type=3)
    assert e.value.key == "max_gears_per_type"


def test_none_disables_the_memory_threshold():
    assert PolicyConfig(device_memory_usage_threshold_ratio=None)
    assert from_mapping(PolicyConfig, {"device_memory_usage_threshold_ratio": False}
                        ).device_memory_usage_threshold_ratio is None


@pytest.mark.parametrize("table", ["", "[policy]\n"])
def test_toml_at_top_level_or_under_policy(tmp_path: Path, table: str):
    path = tmp_path / "c.toml"
    path.write_text(f"{table}window_seconds = 120\nadd_min_samples = 3\n"
                    "device_memory_usage_threshold_ratio = false\n")
    c = load_policy_config(path)
    assert (c.window_seconds, c.add_min_samples) == (120, 3)
    assert c.device_memory_usage_threshold_ratio is None


@pytest.mark.parametrize(("text", "key", "message"), [
    ("windowseconds = 3\n", "windowseconds", "unknown key"),
    ("w_h = 2.0\n", "w_h", "outside"),
    ("w_h = \n", "config", "not valid TOML"),
])
def test_bad_toml_names_the_key(tmp_path: Path, text: str, key: str, message: str):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as e:
        load_policy_config(path)
    assert e.value.key == key


def test_missing_file():
    with pytest.raises(ConfigError, match="file not found"):
        load_policy_config("/nonexistent/gearshift.toml")


def test_overrides_are_parsed_by_field_type_and_win_over_the_file(tmp_path: Path):
    path = tmp_path / "c.toml"
    path.write_text("[policy]\nw_h = 0.5\nadd_min_samples = 3\n")
    c = load_policy_config(path, ["add_min_samples=7", "w_h = 0.7",
                                  "device_memory_usage_threshold_ratio=none"])
    assert (c.add_min_samples, c.w_h, c.device_memory_usage_threshold_ratio) == (7, 0.7, None)
    assert parse_overrides(PolicyConfig, ["policy_mode=rules"]) == {"policy_mode": "rules"}


@pytest.mark.parametrize(("item", "key", "message"), [
    ("add_min_samples=many", "add_min_samples", "expected an integer, got 'many'"),
    ("w_h=abc", "w_h", "expected a number, got 'abc'"),
    ("device_memory_usage_threshold_ratio=abc", "device_memory_usage_threshold_ratio",
     "expected a number or none, got 'abc'"),
    ("nosuchkey=1", "nosuchkey", "unknown key"),
    ("w_h", "w_h", "expected KEY=VALUE"),
    ("w_h=9", "w_h", "outside"),
])
def test_bad_overrides_name_the_key(item: str, key: str, message: str):
    with pytest.raises(ConfigError, match=message) as e:
        load_policy_config(None, [item])
    assert e.value.key == key


def test_scaled_divides_every_duration():
    c = PolicyConfig(policy_mode="rules").scaled(10)
    assert (c.window_seconds, c.half_life_seconds, c.slice_seconds) == (30.0, 15.0, 1.0)
    assert c.recent_use_protect_seconds == 30.0
    assert dataclasses.replace(c, w_h=0.6) == c  # weights and counts untouched


@pytest.mark.parametrize(("text", "key", "message"), [
    ("[polcy]\nwindow_seconds = 3\n", "polcy", r"unknown table \[polcy\]"),
    ("[controler]\nslots = 8\n", "controler", r"unknown table \[controler\]"),
    ("[policy.extra]\nw_h = 0.5\n", "extra", r"unknown table \[policy.extra\]"),
    ("w_h = 0.5\n[policy]\nw_p = 0.2\n", "w_h", r"beside the \[policy\] table"),
])
def test_unknown_or_misplaced_tables_are_errors_naming_them(
    tmp_path: Path, text: str, key: str, message: str
) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as e:
        load_policy_config(path)
    assert e.value.key == key


def test_the_priced_keys_default_to_half_an_hour_and_no_budget():
    c = PolicyConfig()
    assert (c.plan_payback_seconds, c.graph_memory_budget_bytes) == (1800.0, None)
    assert PolicyConfig(graph_memory_budget_bytes=8 << 30).graph_memory_budget_bytes == 8 << 30
    scaled = PolicyConfig(graph_memory_budget_bytes=1e9).scaled(10)
    assert (scaled.plan_payback_seconds, scaled.graph_memory_budget_bytes) == (180.0, 1e9)
    c = load_policy_config(None, ["graph_memory_budget_bytes=1e9", "plan_payback_seconds=60"])
    assert (c.plan_payback_seconds, c.graph_memory_budget_bytes) == (60.0, 1e9)
    assert load_policy_config(None, ["graph_memory_budget_bytes=none"]
                              ).graph_memory_budget_bytes is None


@pytest.mark.parametrize(("key", "value", "message"), [
    ("plan_payback_seconds", 0.0, r"outside \(0.0, 100000000.0\]"),
    ("plan_payback_seconds", -60.0, "outside"),
    ("plan_payback_seconds", float("inf"), "outside"),
    ("plan_payback_seconds", float("nan"), "expected a number"),
    ("plan_payback_seconds", None, "expected a number"),
    ("graph_memory_budget_bytes", 0, r"outside \(0.0, 1125899906842624.0\]"),
    ("graph_memory_budget_bytes", -1.0, "outside"),
    ("graph_memory_budget_bytes", 2.0**51, "outside"),
    ("graph_memory_budget_bytes", float("inf"), "outside"),
    ("graph_memory_budget_bytes", float("nan"), "expected a number"),
    ("graph_memory_budget_bytes", True, "expected a number"),
    ("graph_memory_budget_bytes", "1e9", "expected a number"),
])
def test_the_priced_keys_are_validated_naming_the_key(key, value, message):
    with pytest.raises(ConfigError, match=message) as e:
        PolicyConfig(**{key: value})
    assert e.value.key == key and str(e.value).startswith(f"{key}: ")
    with pytest.raises(ConfigError) as e:
        load_policy_config(None, [f"{key}=-5"])
    assert e.value.key == key
