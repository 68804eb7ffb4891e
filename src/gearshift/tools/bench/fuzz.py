"""`gearshift bench fuzz`: the hostile-input run of `gearshift stress --fuzz`, for the report.

Per boundary (docs/tools.md, "Hostile input"): the cases tried, those refused with a typed
error, and every failure count, each of which must be 0. There is no baseline: the figure is
an invariant, not a speed.
"""

from __future__ import annotations

import click

from gearshift.clikit import json_option
from gearshift.tools.bench.cli import echo_result


@click.command()
@click.option("--seconds", default=120.0, show_default=True, type=click.FloatRange(5, 3600),
              help="How long the whole run takes, shared among the boundaries.")
@json_option()
def command(seconds: float, as_json: bool) -> None:
    """Fuzz every boundary for SECONDS: cases, refusals and failures per boundary."""
    from gearshift.tools.stress import fuzz

    try:
        fuzz.require()  # hypothesis: the `test` extra
    except ImportError as e:
        raise click.ClickException(str(e)) from e
    tallies = fuzz.everything(seconds)
    echo_result({f"{name}.{figure}": value for name, t in tallies.items()
                 for figure, value in t.figures().items()}, as_json)
