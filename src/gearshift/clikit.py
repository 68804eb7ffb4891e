"""Click building blocks shared by every subcommand: exit statuses, common options, the lazy
group. Subcommands live beside the code they drive; `sys.exit` happens only in CLI modules."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar

import click

EXIT_OK = 0
EXIT_ERROR = 1  # a runtime failure
EXIT_USAGE = 2  # click's own code for bad arguments
EXIT_NOT_RUNNING = 3  # no live controller in the namespace
EXIT_CONFLICT = 4  # another controller owns the namespace, or workers are alive

F = TypeVar("F", bound=Callable[..., Any])



def json_option(help: str = "Print one JSON object.") -> Callable[[F], F]:
    return click.option("--json", "as_json", is_flag=True, help=help)


def namespace_option(help: str, **kwargs: Any) -> Callable[[F], F]:
    """`--namespace/-n NS`: the shared-memory namespace of one controller and its workers."""
    return click.option("--namespace", "-n", metavar="NS", help=help, **kwargs)


def config_options(what: str, layout: str) -> Callable[[F], F]:
    """`--config FILE.toml` (keys laid out as `layout` says) and repeatable `--set KEY=VALUE`,
    for the keys `what` names."""

    def apply(fn: F) -> F:
        fn = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                          help=f"Override one {what} key (after --config); repeatable.")(fn)
        return click.option("--config", "config_path", metavar="FILE.toml",
                            envvar="GEARSHIFT_CONFIG", show_envvar=True,
                            help=f"TOML file of {what} keys: {layout}.")(fn)

    return apply


def log_level_option(default: str, help: str) -> Callable[[F], F]:
    return click.option("--log-level", default=default, envvar="GEARSHIFT_LOG_LEVEL",
                        show_default=True, help=help,
                        type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"],
                                          case_sensitive=False))


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
