"""`gearshift demo`: adaptive gears against static power-of-two gears on a shipped trace."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any, NoReturn

import click

from gearshift.cli import EXIT_ERROR, EXIT_USAGE
from gearshift.config import load_policy_config
from gearshift.demo.workload import DEFAULT_TRACE, load_workload
from gearshift.errors import ConfigError, GearshiftError

EXIT_INTERRUPTED = 130  # the shell's code for a run ended by SIGINT


@click.command(
    epilog="Exit status: 0 done; 1 a worker or the controller failed, or the trace cannot be "
    "read; 2 bad options; 130 interrupted (everything started is ended and removed first)."
)
@click.option(
    "--workers",
    default=4,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Worker processes, each running the model.",
)
@click.option(
    "--trace",
    default=DEFAULT_TRACE,
    show_default=True,
    metavar="NAME|PATH",
    help="A shipped trace name or a trace CSV.",
)
@click.option(
    "--seconds",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=5),
    help="About how long the whole demo takes (start-up and both runs).",
)
@click.option(
    "--namespace",
    "-n",
    metavar="NS",
    help="Shared-memory namespace of its controller [default: demo-<pid>].",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="A policy key, in trace seconds (scaled with the time compression).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print one JSON object: {"adaptive", "static", "speedup", ...}.',
)
def demo(
    workers: int,
    trace: str,
    seconds: float,
    namespace: str | None,
    overrides: tuple[str, ...],
    as_json: bool,
) -> None:
    """Replay a trace through N workers with adaptive gears, then with static ones.

    Starts an embedded controller and N worker processes that run a small torch model
    (x + W2 gelu(W1 x) over x = [*dims, 32]: cost proportional to padded tokens) on the CPU
    backend through the adaptive graph runner, and replays the trace (default: the shipped
    Azure conversation trace, prefill batches, BATCHSIZE x SEQLEN) with time compressed so the
    demo takes about --seconds: every k-th row if needed, and the policy's windows and
    intervals divided by the same factor. Then the same requests run on static power-of-two
    gears, and a table compares them: useful tokens per second (wall time, captures included),
    padding overhead, mean gears, adds and evictions, graph captures, propagation lag.
    """
    try:
        policy = load_policy_config(None, overrides)
        workload = load_workload(trace)
    except ConfigError as e:
        _fail(EXIT_USAGE, str(e))
    except GearshiftError as e:
        _fail(EXIT_ERROR, str(e))
    from gearshift.demo.run import Demo  # the controller: not needed for --help

    progress = _Progress(sys.stderr)
    run = Demo(workload, workers, seconds, namespace or f"demo-{os.getpid()}", policy, progress)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        result = run.run()
    except KeyboardInterrupt:
        _fail(EXIT_INTERRUPTED, "interrupted; every process and segment it started is gone")
    except GearshiftError as e:
        _fail(EXIT_ERROR, str(e))
    finally:
        signal.signal(signal.SIGTERM, previous)
        progress.end()
    click.echo(json.dumps(result) if as_json else table(result))


def _interrupt(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def _fail(code: int, message: str) -> NoReturn:
    click.echo(f"error: {message}" if code != EXIT_INTERRUPTED else message, err=True)
    sys.exit(code)


class _Progress:
    """The live line on a terminal (rewritten in place), else one line every few seconds."""

    def __init__(self, stream: Any, every: float = 5.0) -> None:
        self.stream, self.every = stream, every
        self.tty = stream.isatty()
        self.due: tuple[str, float] | None = None  # the run shown, when its next line is due
        self.open = False  # a terminal line not ended yet

    def __call__(self, p: Any) -> None:
        new = self.due is None or self.due[0] != p.run
        if not (self.tty or new or p.seconds >= self.due[1]):  # type: ignore[index]
            return
        if new and self.open:
            self.stream.write("\n")  # keep the previous run's last line
        self.due = (p.run, p.seconds + self.every)
        gears = "  ".join(f"{d} {n} gears" for d, n in p.gears.items())
        version = f"  snapshot v{p.version}" if p.version is not None else ""
        line = (
            f"[{p.seconds:6.1f} s] {p.run:8} {p.done:>7,}/{p.total:,} requests  "
            f"{gears}  padding {p.padding:6.1%}{version}"
        )
        self.stream.write(f"\r\x1b[2K{line}" if self.tty else f"{line}\n")
        self.stream.flush()
        self.open = self.tty

    def end(self) -> None:
        if self.open:
            self.stream.write("\n")
            self.open = False
        self.due = None


def _si(x: float) -> str:
    return f"{x / 1e6:.2f} M" if x >= 1e6 else f"{x / 1e3:.1f} k"


def table(r: dict[str, Any]) -> str:
    """The side-by-side table of `Demo.run()`'s result."""
    a, s = r["adaptive"], r["static"]
    rows = [
        ("wall time, captures included", f"{a['seconds']:.1f} s", f"{s['seconds']:.1f} s"),
        (
            "useful tokens per second",
            _si(a["useful_tokens_per_second"]),
            _si(s["useful_tokens_per_second"]),
        ),
        (
            "useful tokens per CPU second",
            _si(a["useful_tokens_per_cpu_second"]),
            _si(s["useful_tokens_per_cpu_second"]),
        ),
        (
            "padding overhead (tokens)",
            f"{a['padding_overhead']:.1%}",
            f"{s['padding_overhead']:.1%}",
        ),
    ]
    for d in a["dims"]:
        ad, sd = a["dims"][d], s["dims"][d]
        rows += [
            (f"  {d} padding", f"{ad['padding_overhead']:.1%}", f"{sd['padding_overhead']:.1%}"),
            (f"  {d} mean gears", f"{ad['mean_gears']:.1f}", f"{sd['mean_gears']:.1f}"),
        ]
    lag = a["propagation_lag"]
    rows += [
        (
            "computed / useful tokens",
            f"{a['computed_tokens'] / a['useful_tokens']:.3f}",
            f"{s['computed_tokens'] / s['useful_tokens']:.3f}",
        ),
        (
            "CPU s: workers / demo process",
            f"{a['worker_cpu_seconds']:.1f} / {a['parent_cpu_seconds']:.1f}",
            f"{s['worker_cpu_seconds']:.1f} / {s['parent_cpu_seconds']:.1f}",
        ),
        ("adds / evictions", f"{a['adds']} / {a['evictions']}", f"{s['adds']} / {s['evictions']}"),
        ("graph captures", f"{a['captures']:,}", f"{s['captures']:,}"),
        ("eager runs (no graph ready)", f"{a['eager']:,}", f"{s['eager']:,}"),
        ("snapshot version", f"v{a['snapshot_version']}", "-"),
        (
            "propagation lag, mean (n)",
            f"{lag['mean_ms']:.0f} ms ({lag['count']})" if lag else "-",
            "-",
        ),
    ]
    head = (
        f"gearshift demo: {r['trace']}, {r['requests']:,} requests (1 row in {r['stride']} of "
        f"{r['rows']:,}), "
        f"{r['workers']} workers; time compressed {r['time_compression']:.0f}x (policy windows "
        f"and intervals divided by it); {r['seconds']:.0f} s in all"
    )
    width = max(len(name) for name, *_ in rows) + 2
    lines = [head, "", f"{'':{width}}{'adaptive':>14}{'static pow2':>16}"]
    lines += [f"{name:{width}}{x:>14}{y:>16}" for name, x, y in rows]
    lines += [
        "",
        f"speedup (useful tokens per second, adaptive / static): {r['speedup']:.2f}x",
        f"per CPU second (workers and controller; robust to other load): {r['cpu_speedup']:.2f}x",
    ]
    return "\n".join(lines)
