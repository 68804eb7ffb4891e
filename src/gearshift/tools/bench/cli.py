"""`gearshift bench NAME`: each benchmark module exposes a click command named `command`."""

from __future__ import annotations

import json
from collections.abc import Mapping

import click

from gearshift.clikit import LazyGroup

BENCHMARKS = {
    "all": "gearshift.tools.bench.report:command",
    "compile": "gearshift.tools.bench.compiling:command",
    "controller": "gearshift.tools.bench.controller:command",
    "fuzz": "gearshift.tools.bench.fuzz:command",
    "graphs": "gearshift.tools.bench.graphs:command",
    "hotpath": "gearshift.tools.bench.hotpath:command",
    "optimal": "gearshift.tools.bench.optimal:command",
    "policy": "gearshift.tools.bench.policy:command",
    "ring": "gearshift.tools.bench.ring:command",
    "simulate": "gearshift.tools.bench.simulate:command",
    "snapshot": "gearshift.tools.bench.snapshot:command",
    "step": "gearshift.tools.bench.step:command",
    "synthetic": "gearshift.tools.bench.synthetic:command",
}


@click.group(cls=LazyGroup, lazy=BENCHMARKS)
def bench() -> None:
    """Run a benchmark, each figure against a baseline.

    Every figure comes with a baseline measured in the same run."""


def echo_result(result: Mapping[str, float], as_json: bool) -> None:
    """A benchmark's figures: one JSON object, or one aligned `name: value` line each."""
    if as_json:
        click.echo(json.dumps(result))
        return
    width = max(map(len, result))
    for key, value in result.items():
        click.echo(f"{key:>{width}}: {_shown(value)}")


def _shown(value: object) -> str:
    """A figure: floats to 3 decimals, a range [min, max] as `min – max`."""
    if isinstance(value, (list, tuple)):
        return " – ".join(map(_shown, value))
    return f"{value:,.3f}" if isinstance(value, float) else f"{value:,}"
