"""`gearshift serve | status | snapshot | stop | cleanup | export`: the controller's commands."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

import click

from gearshift import clikit
from gearshift.clikit import EXIT_CONFLICT, EXIT_ERROR, EXIT_NOT_RUNNING, EXIT_USAGE
from gearshift.clock import MonotonicClock
from gearshift.controller import status as status_doc
from gearshift.controller.config import load_configs, load_initial_gears
from gearshift.controller.controller import Controller
from gearshift.core.dims import Dim
from gearshift.errors import (
    ConfigError,
    ControllerNotFound,
    ControllerRunning,
    GearshiftError,
    NamespaceBusy,
    NamespaceError,
)
from gearshift.shm import Registry, SlotState, Snapshot, SnapshotRegion, cleanup, liveness, names
from gearshift.shm.segment import SHM_DIR

DEFAULT_NAMESPACE = "default"
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
    "Namespace of the shared-memory objects: one controller and its workers "
    f"[default: {DEFAULT_NAMESPACE!r}; for serve, [controller] namespace of --config first].",
    envvar="GEARSHIFT_NAMESPACE",
    show_envvar=True,
)
json_option = clikit.json_option("Print JSON.")


@contextmanager
def _exits() -> Iterator[None]:
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
    envvar="GEARSHIFT_STATE_DIR",
    show_envvar=True,
    metavar="DIR",
    help="Directory of the state file [default: $XDG_STATE_HOME/gearshift/NS, "
    "else ~/.local/state/gearshift/NS].",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    envvar="GEARSHIFT_METRICS_PORT",
    show_envvar=True,
    help="Serve Prometheus metrics on this port (needs the "
    "metrics extra: pip install 'gearshift[metrics]').",
)
@clikit.log_level_option("INFO", "INFO logs every decision with its reasons.")
@click.option(
    "--initial-gears",
    metavar="gears.json",
    help="Gears for profiles the state file does not know yet, as written by "
    "`gearshift export` on another node.",
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
    log_level: str,
    initial_gears: str | None,
    fresh_on_corrupt_state: bool,
) -> None:
    """Run the controller of a namespace in the foreground until SIGTERM or SIGINT.

    It drains the workers' event rings, keeps decayed statistics per device, profile and
    dim, runs the gear policy every check interval and publishes a new snapshot of each
    device whose gears change. The state file (gears, protections, statistics, versions) is
    saved after every change and at exit, and restored at start: a restart resumes where it
    stopped. A dead controller's namespace is taken over; a live one's is refused.

    On SIGTERM/SIGINT: final drain, state saved, exit 0. Live workers keep serving on their
    last snapshot and every shared-memory object stays for the next controller; with no
    live worker the namespace is removed.
    """
    logging.getLogger().setLevel(log_level.upper())
    stop = threading.Event()  # handlers first: `gearshift stop` may signal as soon as we own it
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        with _exits():
            policy, config = load_configs(
                config_path,
                overrides,
                namespace=namespace,
                state_dir=state_dir,
                metrics_port=metrics_port,
            )
            seed = load_initial_gears(initial_gears) if initial_gears else None
            controller = Controller.open(
                config, policy, initial_gears=seed, fresh_on_corrupt_state=fresh_on_corrupt_state
            )
        controller.run(stop)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@click.command(epilog=EPILOG)
@namespace_option
@json_option
@click.option("--watch", is_flag=True, help="Refresh every second until Ctrl-C.")
def status(namespace: str | None, as_json: bool, watch: bool) -> None:
    """Show the controller, its workers and, per device and profile, the snapshot version,
    the gears of each dim with their decayed hit rate and padding, dropped events,
    propagation lag and the last round's decisions with their reasons.

    Exit status 3 when no live controller serves the namespace (what is known is shown).
    """
    namespace = namespace or DEFAULT_NAMESPACE
    clock = MonotonicClock()
    with _exits(), suppress(KeyboardInterrupt):
        while True:
            view = _gather(namespace, clock)
            if as_json:
                click.echo(json.dumps(view))
            else:
                if watch:
                    click.clear()
                click.echo(_render_status(view))
            if not watch:
                break
            clock.sleep(1.0)
    if not view["controller"]["alive"]:
        sys.exit(EXIT_NOT_RUNNING)


@click.command(epilog=EPILOG)
@namespace_option
@click.option("--device", "-d", type=click.IntRange(min=0), help="Only this device.")
@json_option
def snapshot(namespace: str | None, device: int | None, as_json: bool) -> None:
    """Print the snapshot each device's workers use now: its version, the gears of every
    profile and dim, and the last round's changes with their reasons."""
    with _exits():
        snapshots = _snapshots(namespace or DEFAULT_NAMESPACE, device)
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
def export(namespace: str | None) -> None:
    """Print the gears in use on every device as JSON, for `gearshift serve --initial-gears`
    on another node: {"devices": {"<device>": {"<profile>": {"<dim>": [gears]}}}}."""
    with _exits():
        snapshots = _snapshots(namespace or DEFAULT_NAMESPACE, None)
    click.echo(
        json.dumps(
            {
                "devices": {
                    str(d): {name: p["gears"] for name, p in s.payload.get("profiles", {}).items()}
                    for d, s in snapshots.items()
                }
            },
            indent=1,
        )
    )


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
    """Ask the namespace's controller to stop (SIGTERM: final drain, state saved) and wait
    until its process has exited. An embedded controller is refused: stop its worker."""
    namespace = namespace or DEFAULT_NAMESPACE
    clock = MonotonicClock()
    with _exits():
        registry = Registry.attach(namespace)
        try:
            owner = registry.controller()
        finally:
            registry.close()
        if not owner.alive:
            raise ControllerNotFound(f"namespace {namespace!r} has no live controller")
        doc = status_doc.read(namespace)
        if doc and doc["embedded"] and doc["pid"] == owner.pid:
            raise NamespaceBusy(
                f"the controller of namespace {namespace!r} is embedded in "
                f"worker pid {owner.pid}: stop that worker instead"
            )
        ident = liveness.identity(owner.pid)
        os.kill(owner.pid, signal.SIGTERM)
        deadline = clock.now() + timeout
        while liveness.alive(ident):
            if clock.now() >= deadline:
                raise GearshiftError(f"controller pid {owner.pid} still runs after {timeout} s")
            clock.sleep(0.02)
    click.echo(f"controller pid {owner.pid} of namespace {namespace!r} stopped")


@click.command("cleanup", epilog=EPILOG)
@namespace_option
def cleanup_command(namespace: str | None) -> None:
    """Remove the shared-memory objects of a namespace whose controller and workers are all
    dead (refused, removing nothing, while any of them lives)."""
    namespace = namespace or DEFAULT_NAMESPACE
    with _exits():
        removed = cleanup(namespace)
    click.echo("\n".join(removed) if removed else f"namespace {namespace!r}: nothing to remove")


def _snapshots(namespace: str, device: int | None) -> dict[int, Snapshot]:
    """The latest snapshot of every device of `namespace` (or of `device` only)."""
    pattern = names.segment_pattern(namespace)
    found = (pattern.fullmatch(entry) for entry in os.listdir(SHM_DIR))
    devices = sorted(int(m[1][5:]) for m in found if m and m[1].startswith("snap."))
    out = {}
    for d in devices if device is None else [d for d in devices if d == device]:
        region = SnapshotRegion.attach(namespace, d)
        try:
            snap = region.read()
        finally:
            region.close()
        if snap is not None:
            out[d] = snap
    if not out:
        raise ControllerNotFound(
            f"namespace {namespace!r} has no published snapshot"
            + (f" of device {device}" if device is not None else "")
        )
    return out


def _gather(namespace: str, clock: MonotonicClock) -> dict[str, Any]:
    registry = Registry.attach(namespace)
    try:
        owner = registry.controller()
        slots = [s._asdict() for s in registry.slots() if s.state != SlotState.FREE]
    finally:
        registry.close()
    for s in slots:
        s["state"] = SlotState(s["state"]).name.lower()
    beat = clock.now() - owner.heartbeat_ns / 1e9 if owner.heartbeat_ns else None
    return {
        "namespace": namespace,
        "controller": {"pid": owner.pid, "alive": owner.alive, "heartbeat_age_seconds": beat},
        "slots": slots,
        "status": status_doc.read(namespace),
    }


def _render_status(view: dict[str, Any]) -> str:
    owner, doc = view["controller"], view["status"]
    mode = " (embedded in a worker)" if doc and doc["embedded"] else ""
    head = f"namespace {view['namespace']!r}: controller pid {owner['pid']}{mode} " + (
        "running" if owner["alive"] else "NOT RUNNING"
    )
    if owner["heartbeat_age_seconds"] is not None:
        head += f", last heartbeat {owner['heartbeat_age_seconds']:.1f} s ago"
    lines = [head]
    if doc:
        e, r = doc["events"], doc["rounds"]
        lines.append(
            f"events: {e['consumed']} consumed, {e['folded']} folded, {e['unknown']} "
            f"unknown profile, {e['invalid']} invalid; {e['reclaimed_workers']} dead "
            f"workers reclaimed; {r['count']} rounds, last "
            f"{_ms(r['last_seconds'])}; {e['errors']} loop errors"
        )
    consumed = {(w["slot"], w["generation"]): w for w in (doc or {}).get("workers", [])}
    lines.append(
        f"{'slot':>4} {'pid':>8} {'device':>6} {'state':>8} {'applied':>7} "
        f"{'consumed':>10} {'dropped':>8}  profiles"
    )
    for s in view["slots"]:
        w = consumed.get((s["slot"], s["generation"]), {})
        profiles = ", ".join(name for _, name in w.get("profiles", []))
        state = s["state"] if s["alive"] or s["state"] != "active" else "dead"
        lines.append(
            f"{s['slot']:>4} {s['pid']:>8} {s['device']:>6} {state:>8} "
            f"{s['applied_version']:>7} {w.get('consumed', '-'):>10} "
            f"{w.get('dropped', s['dropped']):>8}  {profiles}"
        )
    for dev in (doc or {}).get("devices", []):
        usage = dev["memory_usage"]
        lines.append(
            f"device {dev['device']}: version {dev['version']}, memory "
            + (f"{usage:.0%}" if usage is not None else "unknown")
            + f", propagation lag {_ms(dev['lag']['last_seconds'])} (last)"
        )
        for p in dev["profiles"]:
            for d in p["dims"]:
                priced = tuple(d["cost"]) != Dim.cost  # plan mode weighs padding by it
                lines.append(
                    f"  {p['name']}/{d['name']}: padding {d['padding']:.3f} over "
                    f"{d['samples']} samples in the window"
                    + (f", {d['history_samples']} in the history" if "history_samples" in d else "")
                    + (f"; cost of a chunk of size x: {_polynomial(d['cost'])}" if priced else "")
                )
                lines.append("    gear " + " ".join(f"{g:>6}" for g in d["gears"]))
                lines.append("    hit  " + " ".join(f"{h:>6.3f}" for h in d["hit_rate"]))
                lines.append("    pad  " + " ".join(f"{a:>6.3f}" for a in d["avg_pad"]))
            for dim, gear, action, reason in p["changes"]:
                lines.append(f"  {p['name']}/{dim} last round: {action} {gear}: {reason}")
    return "\n".join(lines)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _polynomial(coefficients: list[float]) -> str:
    """`Dim.cost` as text: 0.0002 + 2.35e-06 x + 1.15e-09 x^2."""
    terms = [
        f"{c:g}" + ("" if i == 0 else " x" if i == 1 else f" x^{i}")
        for i, c in enumerate(coefficients)
        if c
    ]
    return " + ".join(terms)
