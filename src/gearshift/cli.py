"""The `gearshift` command line: a thin click layer over the library.

Subcommands live beside the code they drive and are imported only when run,
so `gearshift status` never pays for torch. Exit codes are the named
constants below; `sys.exit` happens only here and in the subcommand modules.
"""

from __future__ import annotations

import importlib
import logging

import click

EXIT_OK = 0
EXIT_ERROR = 1  # a runtime failure
EXIT_USAGE = 2  # click's own code for bad arguments
EXIT_NOT_RUNNING = 3  # no live controller in the namespace
EXIT_CONFLICT = 4  # another controller owns the namespace, or workers are alive

# name -> "module:attribute" of a click command, imported on first use.
COMMANDS = {
    "simulate": "gearshift.simulate_cli:simulate",
    "demo": "gearshift.demo.cli:demo",
    "bench": "gearshift.bench.cli:bench",
    "serve": "gearshift.controller.cli:serve",
    "status": "gearshift.controller.cli:status",
    "snapshot": "gearshift.controller.cli:snapshot",
    "stop": "gearshift.controller.cli:stop",
    "cleanup": "gearshift.controller.cli:cleanup_command",
    "export": "gearshift.controller.cli:export",
    "stress": "gearshift.stress.cli:command",
}


class LazyGroup(click.Group):
    """A group whose subcommands are imported from `lazy` only when invoked or listed."""

    def __init__(self, *args: object, lazy: dict[str, str], **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self.lazy:
            module, _, attr = self.lazy[name].partition(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gearshift")
@click.option("--log-level", default="WARNING", envvar="GEARSHIFT_LOG_LEVEL", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
              help="Logging threshold for messages on stderr.")
def main(log_level: str) -> None:
    """gearshift: adaptive shape gears for accelerator graphs.

    Workers record every request's raw shape into shared-memory rings; one
    sidecar controller per node decides which gears (padded sizes with a
    captured graph) to keep, evict and add, and publishes versioned snapshots.
    """
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
