"""README.md stays true: its commands, its worker example, its deployment figures, and the tables
it links to: every configuration key with its real default (docs/configuration.md, the one place
they live) and the CLI table (docs/tools.md, "The commands")."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import click
import pytest

from gearshift.cli import main
from gearshift.controller.config import ControllerConfig
from gearshift.controller.footprint import footprint, mib
from gearshift.core.config import PolicyConfig
from gearshift.graphs.transform import DEFAULT_SYMBOLS
from gearshift.tools.bench.cli import BENCHMARKS
from gearshift.worker.session import Client

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.DOTALL)


def section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_first_command_runs_the_demo_and_second_is_what_ci_runs() -> None:
    demo, tests = blocks("sh")[:2]
    assert demo.strip().endswith("gearshift demo")
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests.strip().split(" && ", 2)[2] in ci  # the install, ruff and pytest line


def test_worker_example_prints_what_the_readme_says_on_every_run(
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    inductor_cache: Path,
) -> None:
    (code,) = blocks("python")
    assert len(code.strip().splitlines()) <= 13
    (said,) = re.findall(r"It prints `(.*?)`\s+on every run", section("A worker"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))  # where a state file would go
    monkeypatch.setenv("GEARSHIFT_NAMESPACE", namespace)  # gs.compile's namespace
    # Dynamo without Inductor: what it prints is the same, in seconds rather than a minute on
    # 2 loaded cores (Inductor's gears are checked against eager in tests/graphs)
    code = code.replace("embedded=True)", 'embedded=True, backend="eager")')
    assert 'backend="eager"' in code
    for _ in range(2):
        exec(compile(code, "README.md", "exec"), {})
        assert capsys.readouterr().out == said + "\n"
    assert not list(tmp_path.iterdir())  # no state kept between the runs


def test_cli_table_names_every_command_and_benchmark() -> None:
    tools = (ROOT / "docs" / "tools.md").read_text()  # the README links to this table
    table = tools.split("## The commands\n", 1)[1].split("\n## ", 1)[0]
    assert '"The commands"' in section("Command line")
    with click.Context(main) as ctx:
        commands = main.list_commands(ctx)
    for name in commands:
        assert f"`gearshift {name}" in table, name
    for name in BENCHMARKS:
        assert f"`{name}`" in table or f"`gearshift bench {name}`" in table, name


CONFIGURATION = (ROOT / "docs" / "configuration.md").read_text()  # the README links to it


def _rows(marker: str) -> dict[str, str]:
    """The key -> default cells of the table that follows `marker` in docs/configuration.md."""
    table = CONFIGURATION.split(marker, 1)[1].split("\n\n", 2)[1]
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    return {key.strip("| `"): default for key, default, *_ in rows}


@pytest.mark.parametrize(("config", "marker"), [(PolicyConfig, "\nPolicy ("),
                                                (ControllerConfig, "\nController (")])
def test_configuration_tables_list_every_key_in_one_place(config: type, marker: str) -> None:
    assert "(docs/configuration.md)" in section("Configuration")
    assert "| `namespace` |" not in README  # the table lives in docs/configuration.md only
    keys = " ".join(_rows(marker))
    for field in dataclasses.fields(config):
        assert field.name in keys, field.name


def test_controller_table_gives_each_keys_real_default() -> None:
    rows = _rows("\nController (")
    for field in dataclasses.fields(ControllerConfig):
        cell = rows[field.name].strip("`")
        if field.default is None:
            assert cell == "none", field.name
        elif isinstance(field.default, str):
            assert cell == (field.default or '""'), field.name
        else:
            assert float(cell) == field.default, field.name


def test_deployment_states_the_dev_shm_a_node_needs() -> None:
    need = footprint(page=4096)
    text = " ".join(section("Deployment").split())
    per = (f"{mib(need.fixed)} per namespace (its control segment of {ControllerConfig().slots} "
           f"slots, lock and status region), {mib(need.per_worker)} per worker (its event ring) "
           f"and {mib(need.per_device)} per device (its snapshot region)")
    assert per in text
    assert f"4 workers on one device need {mib(need.total(4, 1))}" in text
    assert f"64 workers on 8 devices {mib(need.total(64, 8))}" in text
    docker = (64 * 2**20 - need.fixed - need.per_device) // need.per_worker
    assert f"Docker's default of 64 MiB holds {docker} workers on one device" in text
    assert f"tries again every {Client.retry_interval:g} s" in text


def test_the_short_symbols_the_worker_example_binds_are_the_ones_it_names() -> None:
    """`("S", None)` binds SEQLEN through a default symbol: the README says so, and which."""
    said = re.search(r"by `(\w+)` and `(\w+)`, short for `(\w+)` and `(\w+)`",
                     " ".join(section("A worker").split()))
    assert said is not None
    assert dict(zip(said.groups()[:2], said.groups()[2:], strict=True)) == DEFAULT_SYMBOLS
