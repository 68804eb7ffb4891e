"""`gearshift status | snapshot | export`: the controller's commands that read a namespace
from outside (through `view`), changing nothing in it."""

from __future__ import annotations

import json
import sys
from contextlib import suppress

import click

from gearshift import protocol
from gearshift.clikit import EXIT_NOT_RUNNING
from gearshift.clock import MonotonicClock
from gearshift.controller import view
from gearshift.controller.cli import EPILOG, exits, json_option, namespace_option
from gearshift.errors import ControllerNotFound
from gearshift.export import engines
from gearshift.shm import names


@click.command(epilog=EPILOG)
@namespace_option
@json_option
@click.option("--watch", is_flag=True,
              help="Refresh every second until Ctrl-C, across controller restarts.")
@click.option("--verbose", "-v", is_flag=True,
              help="Also each gear's hit and pad rates and the measured costs.")
def status(namespace: str | None, as_json: bool, watch: bool, verbose: bool) -> None:
    """Show the controller, its workers and the gears they use.

    The controller (a stopped one by its last pid) and its workers, and per device and
    profile the snapshot version, the gears of each dim with the dim's padding (in percent),
    dropped events, propagation lag and the last round's decisions with their reasons, in 80
    columns; -v adds each gear's decayed hit and pad rates and the measured costs.

    --watch keeps watching while the controller is stopped or its namespace is gone, and
    shows it again when a controller comes back (with --json, one object per refresh;
    `controller` is null while the namespace is gone).

    --json prints one object: `slots`, the slot table as it is now (applied_version: the
    snapshot each worker has fully adopted); `versions`, each device's snapshot version read
    just after it, so no slot is ahead of its device there; `status`, the controller's last
    status document, published every status_interval_seconds (1 s), whose versions may
    therefore lag the slots'. Ratios (hit_rate, avg_pad, padding) are fractions there.

    Exit status 3 when no live controller serves the namespace (what is known is shown; with
    --watch, when none did at the last refresh before Ctrl-C).
    """
    clock = MonotonicClock()
    alive = False
    with exits(), suppress(KeyboardInterrupt):
        namespace = names.resolve(namespace)
        while True:
            try:
                shown = view.gather(namespace, clock)
            except ControllerNotFound:
                if not watch:
                    raise
                shown = None
            alive = shown is not None and shown["controller"]["alive"]
            if watch and not as_json:
                click.clear()
            if as_json:
                click.echo(json.dumps(shown or {"namespace": namespace, "controller": None}))
            else:
                click.echo(view.absent(namespace) if shown is None
                           else view.render(shown, verbose=verbose))
            if not watch:
                break
            clock.sleep(1.0)
    if not alive:
        sys.exit(EXIT_NOT_RUNNING)


@click.command(epilog=EPILOG)
@namespace_option
@click.option("--device", "-d", type=click.IntRange(min=0), help="Only this device.")
@json_option
def snapshot(namespace: str | None, device: int | None, as_json: bool) -> None:
    """Print the snapshot each device's workers use now.

    Per device its version, the gears of every profile and dim, and the last round's changes
    with their reasons."""
    with exits():
        snapshots = view.snapshots(names.resolve(namespace), device)
    if as_json:
        click.echo(
            json.dumps(
                [{"device": d, "version": s.version, **s.payload} for d, s in snapshots.items()]
            )
        )
        return
    for d, s in snapshots.items():
        click.echo(f"device {d}  version {s.version}")
        for name, profile in s.payload.get("profiles", {}).items():
            for dim, gears in profile["gears"].items():
                click.echo(f"  {name}/{dim}: {' '.join(map(str, gears))}")
            for dim, gear, action, reason in profile.get("changes", []):
                click.echo(f"    last round: {dim} {action} {gear}: {reason}")


@click.command(epilog=EPILOG)
@namespace_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(engines.FORMATS),
    default="json",
    show_default=True,
    help="json: every device and profile, for `serve --initial-gears`; vllm, sglang, trtllm: "
    "the config file of that engine with one profile's batch sizes as its CUDA graph sizes; "
    "torchair: the dim_gears of set_dim_gears, one profile's dims as tensor axes.",
)
@click.option("--profile", metavar="NAME", help="The profile [default: the only one published].")
@click.option(
    "--dim",
    metavar="NAME",
    help="The dim [vllm, sglang, trtllm: BATCHSIZE; torchair: every dim of the profile].",
)
@click.option(
    "--device",
    "-d",
    type=click.IntRange(min=0),
    help="The device [default: the lowest one with the profile].",
)
@click.option(
    "--fit",
    is_flag=True,
    help="Raise gears below the engine's smallest to it (torchair: 1 to 2) instead of refusing.",
)
@click.option(
    "--axis",
    "axes",
    metavar="DIM=N",
    multiple=True,
    help="torchair: the tensor axis of DIM in the input set_dim_gears is called on (S of a "
    "(B, S) tensor: SEQLEN=1); one per dim exported, required.",
)
def export(
    namespace: str | None,
    fmt: str,
    profile: str | None,
    dim: str | None,
    device: int | None,
    fit: bool,
    axes: tuple[str, ...],
) -> None:
    """Print the gears in use, for an engine or another node.

    The gears in use, in the form an engine takes at start-up, or as JSON for
    `gearshift serve --initial-gears` on another node. Every format reads back with
    `serve --initial-gears`. An engine's file holds one profile of one device; what the
    engine cannot express (other dims) is said on stderr, and gears beyond its limits are
    refused (exit status 2). Gears a stopped controller left are exported with a note of
    their age on stderr."""
    with exits():
        namespace = names.resolve(namespace)
        snapshots = view.snapshots(namespace, None)
        published = {  # what reads as gears: a payload is not trusted
            d: {
                name: gears
                for name in view.profile_names(s.payload)
                if (gears := protocol.profile_gears(s.payload, name))
            }
            for d, s in snapshots.items()
        }
        out = engines.render(published, fmt, profile=profile, dim=dim, device=device, fit=fit,
                             axes=engines.parse_axes(axes))
        stale = view.staleness(namespace, MonotonicClock())
    for note in [*([stale] if stale else []), *out.notes]:
        click.echo(f"note: {note}", err=True)
    click.echo(out.text, nl=False)
