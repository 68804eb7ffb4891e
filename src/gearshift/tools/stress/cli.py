"""`gearshift stress`: the command over `stress.run`."""

from __future__ import annotations

import json
import signal
import sys

import click

from gearshift.clikit import EXIT_ERROR, json_option, namespace_option
from gearshift.errors import GearshiftError
from gearshift.tools.stress.harness import StressConfig, run
from gearshift.tools.stress.report import COUNTING


@click.command()
@click.option(
    "--workers",
    default=4,
    show_default=True,
    type=click.IntRange(1, 60),
    help="Worker processes routing flat out.",
)
@click.option(
    "--seconds",
    default=30.0,
    show_default=True,
    type=click.FloatRange(1.0),
    help="How long they route (start-up and shutdown come on top).",
)
@click.option(
    "--chaos",
    is_flag=True,
    help="SIGKILL a worker about every second and the controller about every 5 s; restart them.",
)
@click.option(
    "--pod",
    is_flag=True,
    help="Pod-shaped: the controller and every worker each in a pid namespace of its own "
    "(unshare --pid --fork --mount-proc, as root), sharing /dev/shm, as a Kubernetes sidecar "
    "without shareProcessNamespace; checks that no namespace is replaced under a live "
    "participant and that no two controllers act at once.",
)
@click.option("--seed", default=0, show_default=True, help="Seed of the shapes and the chaos.")
@namespace_option(
    "Namespace to run in, e.g. to watch it with `gearshift status -n NS` "
    "[default: a fresh one].",
    default="",
)
@click.option(
    "--fuzz",
    type=click.FloatRange(1.0),
    metavar="SECONDS",
    help="Instead of the stress run: fuzz every boundary (shared structures, state file, TOML, "
    "trace CSV) for SECONDS in all, then a real `gearshift serve` from outside; a table per "
    "boundary; exit status 1 on any crash, exception into a request, stall over 100 ms, gear "
    "outside its bounds, leaked segment, lost event or unserved worker; then the deployment "
    "faults, a full /dev/shm, a forked worker and a stopped, then dead, lock holder (needs "
    "hypothesis).",
)
@json_option("Print the figures as one JSON object.")
def command(
    workers: int,
    seconds: float,
    chaos: bool,
    pod: bool,
    seed: int,
    namespace: str,
    fuzz: float | None,
    as_json: bool,
) -> None:
    """Stress the whole system and check its invariants.

    --workers processes route random 2-dim shapes through the real client while the
    controller decides every 0.1 s and snapshot readers verify every snapshot they accept.

    It ends with a verdict line, PASS or FAIL, naming the invariants checked. Exit status 1
    (FAIL) if a snapshot was torn, an event lost, a segment leaked, a worker routed on a
    version never published, or a route() call stalled over 1 ms (one that blocked or kept its
    CPU; those interrupted by other processes or the hypervisor are only counted: see
    `gearshift.tools.stress`). Dropped events are not lost: a full ring refuses them and its
    worker counts them (route() never waits); lost = sent - consumed - dropped must be 0.
    """

    if fuzz is not None:
        _fuzz(fuzz, as_json)
        return

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)  # cleans up like Ctrl-C
    try:
        report = run(StressConfig(workers, seconds, chaos, seed=seed, namespace=namespace,
                                  pod=pod))
    except GearshiftError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(EXIT_ERROR)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if as_json:
        click.echo(json.dumps(report.summary()))
    else:
        for key, value in [*report.summary().items(), *report.details.items()]:
            click.echo(f"{key:36} {value}")
        click.echo(COUNTING)
    click.echo(report.verdict(), err=as_json)  # stdout stays one JSON object
    if report.violations():
        sys.exit(EXIT_ERROR)


def _fuzz(seconds: float, as_json: bool) -> None:
    """`--fuzz SECONDS`: the fuzz run (`gearshift.tools.stress.fuzz`), its table, its verdict."""
    from gearshift.tools.stress import fuzz

    try:
        fuzz.require()
    except ImportError as e:
        click.echo(f"error: --fuzz: {e}", err=True)
        sys.exit(EXIT_ERROR)
    tallies = fuzz.everything(seconds)
    if as_json:
        click.echo(json.dumps({name: t.figures() for name, t in tallies.items()}))
    else:
        click.echo(fuzz.table(tallies))
    dirty = [name for name, t in tallies.items() if not t.clean]
    click.echo(f"FAIL: {', '.join(dirty)}" if dirty else "PASS: every boundary", err=as_json)
    if dirty:
        sys.exit(EXIT_ERROR)
