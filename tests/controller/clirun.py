"""The controller's commands run in-process through click's CliRunner."""

from __future__ import annotations

from click.testing import CliRunner, Result

from gearshift.cli import main


def gs(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env=env)
