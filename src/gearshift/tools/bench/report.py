"""`gearshift bench all`: every registered benchmark, one after another, into docs/benchmarks.md.

Each benchmark runs in a fresh process (`python -m gearshift bench NAME --json`, with smaller
sizes under `--quick`), so none inherits another's memory, pools or namespaces. The report
gives the machine, then per benchmark the command, its table (`tables`) and its raw JSON. A
benchmark that fails is reported as failed, the others still run, and the exit status is 1.
How the benchmarks measure: docs/tools.md.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import click

from gearshift.tools.bench.cli import BENCHMARKS
from gearshift.tools.bench.tables import TABLES

ORDER = ("policy", "ring", "snapshot", "controller", "hotpath", "step", "graphs", "optimal",
         "simulate", "synthetic", "fuzz")
QUICK = {
    "policy": ["--events", "1000000", "--baseline-events", "100000", "--runs", "2"],
    "ring": ["--seconds", "1", "--runs", "2"],
    "controller": ["--workers", "2", "--seconds", "1", "--warmup", "0.5", "--profiles", "16",
                   "--profile-seconds", "5"],
    "hotpath": ["--batches", "100"],
    "step": ["--batches", "5", "--idle-seconds", "2"],
    "graphs": ["--quick"],
    "compile": ["--workers", "2", "--gear", "64"],
    "fuzz": ["--seconds", "30"],
    "optimal": ["--values", "2000", "--baseline-values", "500"],
    "synthetic": ["--seeds", "1"],
}
TIMEOUT = 1200.0  # seconds per benchmark


def machine() -> dict[str, str]:
    """CPU model, cores, OS and the versions that matter."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass

    def installed(package: str) -> str:
        try:
            return version(package)
        except PackageNotFoundError:
            return "not installed"

    return {
        "CPU": cpu,
        "cores": f"{len(os.sched_getaffinity(0))} usable of {os.cpu_count()}",
        "OS": f"{platform.system()} {platform.release()} ({platform.machine()})",
        "Python": platform.python_version(),
        **{p: installed(p) for p in ("gearshift", "torch", "numpy", "msgpack", "posix_ipc")},
    }


def run(name: str, quick: bool) -> tuple[dict[str, Any] | None, str, float]:
    """One benchmark in its own process: (its JSON or None, the command, seconds)."""
    args = ["bench", name, "--json", *(QUICK.get(name, []) if quick else [])]
    began = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "gearshift", *args],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
        )
        out, err, code = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired:
        out, err, code = "", f"timed out after {TIMEOUT:.0f} s", -1
    seconds = time.monotonic() - began
    command = "gearshift " + " ".join(args)
    if code != 0:
        return None, f"{command}\n\nfailed (exit status {code}):\n{err.strip()[-2000:]}", seconds
    return json.loads(out.strip().splitlines()[-1]), command, seconds


def render(
    sections: list[tuple[str, dict[str, Any] | None, str, float]],
    invocation: str,
    skipped: list[str],
) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# Benchmarks",
        "",
        f"Written by `{invocation}` on {when}. Each benchmark ran in its own process; every "
        "figure is next to its baseline measured in the same run, and the ratio is how many "
        "times better gearshift's figure is (below 1: worse); for padding, baseline / "
        "gearshift padding overhead, except in rows \"vs hindsight\": plan / optimum, over 1 "
        "worse. Other processes shared the machine: a figure they can move was measured over "
        "several runs and shows its median and range, median (min–max), and its ratio the "
        "median and range of the ratios run by run.",
        "",
        "| machine | |",
        "| --- | --- |",
        *(f"| {k} | {v} |" for k, v in machine().items()),
        "",
    ]
    lines += [f"Not run: `{name}` (not registered in this tree)." for name in skipped]
    for name, result, command, seconds in sections:
        lines += ["", f"## {name}", ""]
        if result is None:
            lines += ["```", command, "```"]
            continue
        lines += [f"`{command}` ({seconds:.0f} s)", ""]
        table = TABLES.get(name)
        if table is not None:
            lines += [
                "| figure | gearshift | baseline, same run | ratio |",
                "| --- | --- | --- | --- |",
            ]
            lines += [f"| {' | '.join(row)} |" for row in table(result)]
            lines.append("")
        lines += ["```json", json.dumps(result, indent=None), "```"]
    return "\n".join(lines) + "\n"


KEPT = "<!-- written by hand: `gearshift bench all` keeps what follows -->"


def kept_tail(path: Path) -> str:
    """What follows the KEPT line in the report at `path` (the line included), written by hand
    from runs `bench all` does not make; empty without it."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return ""
    at = text.find(KEPT)
    return "" if at < 0 else "\n" + text[at:]


@click.command()
@click.option("--quick", is_flag=True, help="Smaller sizes and shorter runs (about a minute).")
@click.option(
    "--output",
    default="docs/benchmarks.md",
    show_default=True,
    type=click.Path(dir_okay=False),
    help="The report to write.",
)
def command(quick: bool, output: str) -> None:
    """Run every registered benchmark and write the report (docs/benchmarks.md)."""
    names = [n for n in ORDER if n in BENCHMARKS]
    names += sorted(set(BENCHMARKS) - set(ORDER) - {"all"})
    skipped = [n for n in ORDER if n not in BENCHMARKS]
    sections = []
    for name in names:
        click.echo(f"bench {name} ...", err=True)
        result, command_line, seconds = run(name, quick)
        click.echo(f"bench {name}: {'done' if result else 'FAILED'} in {seconds:.0f} s", err=True)
        sections.append((name, result, command_line, seconds))
    invocation = "gearshift bench all" + (" --quick" if quick else "")
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text(render(sections, invocation, skipped) + kept_tail(Path(output)))
    click.echo(f"wrote {output}", err=True)
    if any(result is None for _, result, _, _ in sections):
        sys.exit(1)
