"""The `gearshift` command line: a thin click layer over the library.

Subcommands live beside the code they drive and are imported only when run,
so `gearshift status` never pays for torch. Exit codes are `gearshift.clikit`'s
constants; `sys.exit` happens only in the CLI modules.
"""

from __future__ import annotations

import logging

import click

from gearshift.clikit import LazyGroup, log_level_option

# name -> "module:attribute" of a click command, imported on first use.
COMMANDS = {
    "simulate": "gearshift.tools.simulate_cli:simulate",
    "demo": "gearshift.tools.demo.cli:demo",
    "bench": "gearshift.tools.bench.cli:bench",
    "serve": "gearshift.controller.cli:serve",
    "status": "gearshift.controller.cli_read:status",
    "snapshot": "gearshift.controller.cli_read:snapshot",
    "stop": "gearshift.controller.cli:stop",
    "cleanup": "gearshift.controller.cli:cleanup_command",
    "export": "gearshift.controller.cli_read:export",
    "stress": "gearshift.tools.stress.cli:command",
    "fleet": "gearshift.controller.cli_fleet:fleet",
}


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="gearshift")
@log_level_option("WARNING", "Logging threshold for messages on stderr.")
def main(log_level: str) -> None:
    """gearshift: adaptive shape gears for accelerator graphs.

    Workers record every request's raw shape into shared-memory rings; one
    sidecar controller per node decides which gears (padded sizes with a
    captured graph) to keep, evict and add, and publishes versioned snapshots.
    """
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
