from __future__ import annotations

import json
from pathlib import Path

import pytest

from gearshift.controller.config import ControllerConfig, load_configs, load_initial_gears
from gearshift.errors import ConfigError


@pytest.mark.parametrize(
    "key, value",
    [
        ("namespace", "a/b"),
        ("namespace", ".."),
        ("slots", 0),
        ("slots", 2.5),
        ("drain_interval_seconds", 0.0),
        ("scan_interval_seconds", -1.0),
        ("metrics_port", 70000),
        ("metrics_addr", ""),
        ("drain_max_events", True),
    ],
)
def test_invalid_values_name_their_key(key: str, value: object) -> None:
    with pytest.raises(ConfigError) as info:
        ControllerConfig(**{key: value})
    assert info.value.key == key


def test_state_dir_defaults_under_xdg_state_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert ControllerConfig(namespace="ns").state_path == tmp_path / "gearshift" / "ns"
    assert ControllerConfig(state_dir="/x").state_path == Path("/x")


def test_one_file_holds_both_tables_and_set_routes_each_key(tmp_path: Path) -> None:
    path = tmp_path / "gs.toml"
    path.write_text(
        "window_seconds = 600.0\nhalf_life_seconds = 300.0\n"
        "[controller]\nslots = 8\nnamespace = 'fromfile'\n"
    )
    policy, controller = load_configs(
        path, ["slots=16", "add_min_samples=3"], namespace="fromcli", state_dir=None
    )
    assert (policy.window_seconds, policy.add_min_samples) == (600.0, 3)
    assert (controller.slots, controller.namespace, controller.state_dir) == (16, "fromcli", "")


def test_policy_table_and_no_controller_table(tmp_path: Path) -> None:
    path = tmp_path / "gs.toml"
    path.write_text("[policy]\ncheck_interval_seconds = 5.0\n")
    policy, controller = load_configs(path)
    assert policy.check_interval_seconds == 5.0 and controller == ControllerConfig()


@pytest.mark.parametrize(
    "text, overrides, key",
    [
        ("[controller]\nslotz = 3\n", [], "slotz"),
        ("", ["nope=1"], "nope"),
        ("", ["slots=many"], "slots"),
        ("[controller]\nslots = 'x'\n", [], "slots"),
        ("[policy\n", [], "config"),
    ],
)
def test_bad_files_and_overrides_name_the_key(
    tmp_path: Path, text: str, overrides: list[str], key: str
) -> None:
    path = tmp_path / "gs.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_configs(path, overrides)
    assert info.value.key == key


def test_initial_gears_document(tmp_path: Path) -> None:
    path = tmp_path / "gears.json"
    path.write_text(json.dumps({"devices": {"1": {"decode": {"B": [64, 8, 8]}}}}))
    assert load_initial_gears(path) == {1: {"decode": {"B": (8, 64)}}}
    path.write_text(json.dumps({"devices": {"1": {"decode": {"B": [0]}}}}))
    with pytest.raises(ConfigError, match="initial_gears"):
        load_initial_gears(path)
    with pytest.raises(ConfigError, match=r"initial_gears: .*missing\.json: No such file"):
        load_initial_gears(tmp_path / "missing.json")
