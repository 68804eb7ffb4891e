"""README.md stays true: its commands, its worker example, its CLI and configuration tables."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import click
import pytest

from gearshift.cli import main
from gearshift.controller.config import ControllerConfig
from gearshift.core.config import PolicyConfig
from gearshift.tools.bench.cli import BENCHMARKS

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
) -> None:
    (code,) = blocks("python")
    assert len(code.strip().splitlines()) <= 13
    (said,) = re.findall(r"It prints `(.*?)`\s+on every run", section("A worker"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))  # where a state file would go
    code = code.replace("gs.connect(embedded=True)", f"gs.connect({namespace!r}, embedded=True)")
    for _ in range(2):
        exec(compile(code, "README.md", "exec"), {})
        assert capsys.readouterr().out == said + "\n"
    assert not list(tmp_path.iterdir())  # no state kept between the runs


def test_cli_table_names_every_command_and_benchmark() -> None:
    table = section("Command line")
    with click.Context(main) as ctx:
        commands = main.list_commands(ctx)
    for name in commands:
        assert f"`gearshift {name}" in table, name
    for name in BENCHMARKS:
        assert f"`{name}`" in table or f"`gearshift bench {name}`" in table, name


@pytest.mark.parametrize("config", [PolicyConfig, ControllerConfig])
def test_configuration_tables_list_every_key(config: type) -> None:
    table = section("Configuration")
    for field in dataclasses.fields(config):
        assert f"`{field.name}`" in table, field.name
