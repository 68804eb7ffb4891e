"""The `gearshift` group: every command listed with a one-line summary that is not cut."""

from __future__ import annotations

import click
from click.testing import CliRunner

from gearshift.cli import main


def test_top_level_help_gives_each_command_a_whole_one_line_summary() -> None:
    result = CliRunner().invoke(main, ["--help"], terminal_width=80)
    assert result.exit_code == 0
    listed = result.output.split("Commands:\n", 1)[1].splitlines()
    with click.Context(main) as ctx:
        names = main.list_commands(ctx)
    assert [line.split()[0] for line in listed] == names  # one line each
    for line in listed:
        summary = line.split(None, 1)[1]
        assert summary.endswith(".") and not summary.endswith("..."), line
