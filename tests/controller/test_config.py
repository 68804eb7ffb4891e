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
    "text, overrides, message",
    [
        ("[controller]\nslotz = 3\n", [], "slotz: unknown key in [controller] of {path}; "
         "did you mean slots?"),
        ("window_secnds = 3\n", [], "window_secnds: unknown key at the top level of {path}; "
         "did you mean window_seconds"),
        ("[policy]\nwindow_secnds = 3\n", [], "window_secnds: unknown key in [policy] of "
         "{path}; did you mean window_seconds"),
        ("namespace = 'x'\n", [], "namespace: a controller key cannot go at the top level of "
         "{path}: put it under [controller]"),
        ("[controller]\nwindow_seconds = 3\n", [], "window_seconds: a policy key cannot go in "
         "[controller] of {path}: put it under [policy]"),
        ("", ["slot=3"], "slot: unknown key in --set; did you mean slots?"),
    ],
)
def test_an_unknown_key_names_where_it_is_and_what_was_meant(
    tmp_path: Path, text: str, overrides: list[str], message: str
) -> None:
    path = tmp_path / "gs.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_configs(path, overrides)
    assert str(info.value).startswith(message.format(path=path))


def test_a_key_comes_from_its_option_then_set_then_the_variable_then_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "gs.toml"
    path.write_text("[controller]\nnamespace = 'file'\nmetrics_port = 1\n")
    monkeypatch.delenv("GEARSHIFT_NAMESPACE", raising=False)
    assert load_configs(path)[1].namespace == "file"
    monkeypatch.setenv("GEARSHIFT_NAMESPACE", "env")
    monkeypatch.setenv("GEARSHIFT_METRICS_PORT", "2")
    assert load_configs(path)[1].namespace == "env"
    _, config = load_configs(path, ["namespace=set", "metrics_port=3"])
    assert (config.namespace, config.metrics_port) == ("set", 3)  # --set beats the variable
    assert load_configs(path, namespace="flag")[1].namespace == "flag"  # the option beats all
    assert load_configs(path, ["namespace=flag"], namespace="flag")[1].namespace == "flag"


def test_an_option_and_a_set_that_disagree_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--namespace a and --set namespace=b disagree"):
        load_configs(None, ["namespace=b"], namespace="a")
    with pytest.raises(ConfigError, match="metrics_port: --metrics-port 1 and --set"):
        load_configs(None, ["metrics_port=2"], metrics_port=1)


def test_a_bad_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEARSHIFT_METRICS_PORT", "many")
    with pytest.raises(ConfigError, match="metrics_port: GEARSHIFT_METRICS_PORT: expected an"):
        load_configs()


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
