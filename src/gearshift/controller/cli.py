"""`gearshift serve | stop | cleanup`: the controller's life-cycle commands, and what every
controller command shares (exit statuses, epilog, options); the commands that read a namespace
(`status`, `snapshot`, `export`) are in `cli_read.py`."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import click

from gearshift import clikit, environment
from gearshift.clikit import EXIT_CONFLICT, EXIT_ERROR, EXIT_NOT_RUNNING, EXIT_USAGE
from gearshift.clock import MonotonicClock
from gearshift.controller import footprint, statefile, view
from gearshift.controller import status as status_doc
from gearshift.controller.config import (
    ControllerConfig,
    load_configs,
    load_initial_gears,
    seed_lines,
)
from gearshift.controller.controller import Controller
from gearshift.controller.embedded import remove_scratch
from gearshift.controller.metrics import check_endpoint
from gearshift.controller.statefile import remove_state
from gearshift.errors import (
    ConfigError,
    ControllerNotFound,
    ControllerRunning,
    GearshiftError,
    NamespaceBusy,
    NamespaceError,
    StateError,
)
from gearshift.export import engines
from gearshift.shm import Registry, cleanup, lease, liveness, names

log = logging.getLogger(__name__)
EXITS = (  # the first class an error is an instance of decides the exit status
    (ConfigError, EXIT_USAGE),
    (NamespaceError, EXIT_USAGE),
    (ControllerRunning, EXIT_CONFLICT),
    (NamespaceBusy, EXIT_CONFLICT),
    (ControllerNotFound, EXIT_NOT_RUNNING),
    (GearshiftError, EXIT_ERROR),
    (OSError, EXIT_ERROR),
)
EPILOG = (
    "Exit status: 0 done; 1 runtime failure; 2 bad options or configuration; 3 no live "
    "controller (or nothing published) in the namespace; 4 the namespace is owned by "
    "another controller or still has live processes."
)

namespace_option = clikit.namespace_option(
    "Namespace of the shared-memory objects: one controller and its workers, which read the "
    f"variable too [default: {environment.DEFAULT_NAMESPACE!r}; for serve, see its order of "
    f"precedence]. [env var: {environment.VARIABLES['namespace']}]"
)


def _env(key: str) -> str:
    """The help text's note of `key`'s variable (read by `load_configs`, not by click)."""
    return f" [env var: {environment.VARIABLES[key]}]"

json_option = clikit.json_option("Print JSON.")


@contextmanager
def exits() -> Iterator[None]:
    """Turn the library's typed errors into `error: ...` on stderr and the named exit status."""
    try:
        yield
    except tuple(cls for cls, _ in EXITS) as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(next(code for cls, code in EXITS if isinstance(e, cls)))


@click.command(epilog=EPILOG)
@namespace_option
@clikit.config_options(
    "policy or controller",
    "policy keys at top level or under [policy], controller keys (drain_interval_seconds, "
    "scan_interval_seconds, slots, ...) under [controller]",
)
@click.option(
    "--state-dir",
    metavar="DIR",
    help="Directory of the state file [default: $XDG_STATE_HOME/gearshift/NS, "
    "else ~/.local/state/gearshift/NS]." + _env("state_dir"),
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Serve Prometheus metrics on this port (needs the "
    "metrics extra: pip install 'gearshift[metrics]'); checked before anything starts."
    + _env("metrics_port"),
)
@click.option(
    "--metrics-addr",
    metavar="ADDR",
    help="Address of the metrics endpoint [default: 127.0.0.1, this host only; 0.0.0.0: "
    "every interface, e.g. for a Prometheus scraping the pod]." + _env("metrics_addr"),
)
@click.option(
    "--fleet",
    "fleet_url",
    metavar="URL",
    help="Share learned gears and statistics with the nodes publishing at this fsspec URL: a "
    "directory (local or a shared mount), s3://bucket/path (pip install 'gearshift[s3]'), ... "
    "(docs/architecture.md, \"Fleet\")." + _env("fleet_url"),
)
@clikit.log_level_option("INFO", "INFO logs every decision with its reasons.")
@click.option(
    "--initial-gears",
    metavar="FILE",
    help="Gears for profiles the state file does not know yet, as written by "
    "`gearshift export` (any --format), or an engine's own file or command line.",
)
@click.option(
    "--initial-gears-format",
    type=click.Choice(["auto", *engines.FORMATS]),
    default="auto",
    show_default=True,
    help="The format of --initial-gears; auto: its first line, else its keys or flags.",
)
@click.option(
    "--fresh-on-corrupt-state",
    is_flag=True,
    help="If the state file is corrupt or of a newer format, set it aside "
    "(<file>.corrupt), warn and start fresh instead of exiting with status 1.",
)
def serve(
    namespace: str | None,
    config_path: str | None,
    overrides: tuple[str, ...],
    state_dir: str | None,
    metrics_port: int | None,
    metrics_addr: str | None,
    fleet_url: str | None,
    log_level: str,
    initial_gears: str | None,
    initial_gears_format: str,
    fresh_on_corrupt_state: bool,
) -> None:
    """Run a namespace's controller in the foreground.

    Until SIGTERM, SIGINT or SIGHUP it drains the workers' event rings, keeps decayed statistics
    per device, profile and dim, runs the gear policy every check interval and publishes a
    new snapshot of each device whose gears change. The state file (gears, protections,
    statistics, versions) is saved within save_interval_seconds of a change (off the loop),
    for a new profile before its reply, and at exit, and restored at start: a
    restart resumes where it stopped. A dead controller's namespace is taken over; a live
    one's is refused. Workers may start before it (they serve on their initial gears).

    With --fleet it publishes what it learned there once a fleet_publish_seconds and at
    stop, and starts new profiles on the gears the fleet's other live nodes learned.

    A controller key comes from its option (-n, --state-dir, --metrics-*, --fleet), else --set, else
    its GEARSHIFT_* variable, else --config; an option and a --set that disagree are refused.

    On SIGTERM/SIGINT/SIGHUP (a closing terminal): final drain, state saved, exit 0 (1 if
    that save failed). Live workers keep serving on their last snapshot and every
    shared-memory object stays for the next controller, or until the last worker leaves;
    with no live worker the namespace is removed. The state file stays (`gearshift cleanup
    --state` removes it). It warns at start when /dev/shm is smaller than its slots need
    (README, "Deployment").
    """
    logging.getLogger().setLevel(log_level.upper())
    stop = threading.Event()  # handlers first: `gearshift stop` may signal as soon as we own it
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set())
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    }
    try:
        with exits():
            policy, config = load_configs(
                config_path,
                overrides,
                namespace=namespace,
                state_dir=state_dir,
                metrics_port=metrics_port,
                metrics_addr=metrics_addr,
                fleet_url=fleet_url,
            )
            if config.metrics_port is not None:  # before the namespace and state directory
                check_endpoint(config.metrics_addr, config.metrics_port)
            if (small := footprint.check(config.slots)) is not None:
                log.warning("%s", small)
            seed = (
                load_initial_gears(initial_gears, initial_gears_format) if initial_gears else None
            )
            controller = Controller.open(
                config, policy, initial_gears=seed, fresh_on_corrupt_state=fresh_on_corrupt_state
            )
            for line in seed_lines(str(initial_gears), seed or {}, controller.devices):
                log.info("%s", line)
            controller.run(stop)  # StateError if the final save failed, NamespaceLost
        log.info("controller pid %d stopped, state saved to %s", os.getpid(),
                 config.state_path / statefile.STATE_FILE)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@click.command(epilog=EPILOG)
@namespace_option
@click.option(
    "--timeout",
    default=30.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds to wait for the controller to exit.",
)
def stop(namespace: str | None, timeout: float) -> None:
    """Stop a namespace's controller and wait until it has exited.

    SIGTERM: final drain, state saved. An embedded controller is refused: stop its worker.
    Exit status 1 if the controller says its final state save failed."""
    clock = MonotonicClock()
    with exits():
        namespace = names.resolve(namespace)
        try:
            registry = Registry.attach(namespace)
        except ControllerNotFound:
            raise view.none_running(namespace) from None
        try:
            owner = registry.controller()
        finally:
            registry.close()
        if not owner.alive:
            raise view.none_running(namespace)
        if owner.foreign:
            raise NamespaceBusy(
                f"the controller of namespace {namespace!r} runs in another pid namespace (pid "
                f"{owner.pid} there): stop it from there (its container: `kill -TERM "
                f"{owner.pid}`, or delete its pod)")
        doc = status_doc.read(namespace)
        if doc and doc["embedded"] and doc["pid"] == owner.pid:
            raise NamespaceBusy(
                f"the controller of namespace {namespace!r} is embedded in "
                f"worker pid {owner.pid}: stop that worker instead"
            )
        with status_doc.kept_region(namespace) as last:  # its last word on the final save
            if not liveness.send_signal(owner.ident, signal.SIGTERM):  # a pidfd: never a later pid
                raise view.none_running(namespace)
            deadline = clock.now() + timeout
            while liveness.alive(owner.ident):
                if clock.now() >= deadline:
                    raise GearshiftError(f"controller pid {owner.pid} still runs after {timeout} s")
                clock.sleep(0.02)
            failed = status_doc.save_failure(last, owner.pid)
        if failed:
            raise StateError(f"controller pid {owner.pid} of namespace {namespace!r} stopped, but "
                             f"its final state save {failed}")
    click.echo(f"controller pid {owner.pid} of namespace {namespace!r} stopped")


@click.command("cleanup", epilog=EPILOG)
@namespace_option
@click.option(
    "--state",
    "with_state",
    is_flag=True,
    help="Also remove the namespace's state: the state file a controller resumes from (gears, "
    "statistics, versions), a set-aside .corrupt copy and the lock file; then the default state "
    "directory if that empties it. Refused while a controller holds it.",
)
@click.option(
    "--state-dir",
    metavar="DIR",
    help="The state directory, with --state [default: serve's]." + _env("state_dir"),
)
def cleanup_command(namespace: str | None, with_state: bool, state_dir: str | None) -> None:
    """Remove a dead namespace's shared memory (--state: its state).

    Every shared-memory object of a namespace whose controller and workers are all dead
    (refused, removing nothing, while any of them lives; one of another pid namespace is
    watched for its lease, a few seconds, before it is taken for dead), and the temporary state
    directories its dead embedded controllers left. The state file stays, for the next
    controller to resume from, unless --state is given."""
    with exits():
        namespace = names.resolve(namespace)
        given = state_dir or environment.read("state_dir")
        state = ControllerConfig(namespace=namespace, state_dir=given or "").state_path
        removed = cleanup(namespace, patience=lease.LEASE + lease.BEAT) + remove_scratch(namespace)
        if with_state:
            removed += map(str, remove_state(state, remove_directory=not given))
    click.echo("\n".join(removed) if removed else f"namespace {namespace!r}: nothing to remove")
    if not with_state and (state / statefile.STATE_FILE).exists():
        click.echo(f"namespace {namespace!r}: its state stays in {state} (--state removes it)")
