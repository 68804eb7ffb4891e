"""`gearshift bench all`: every registered benchmark, one after another, into docs/benchmarks.md.

Each benchmark runs in a fresh process (`python -m gearshift bench NAME --json`, with smaller
sizes under `--quick`), so none inherits another's memory, pools or namespaces. The report
gives, per benchmark, every figure next to its baseline measured in the same run and their
ratio (the factor by which gearshift's figure is better; below 1 it is worse; for padding, the
ratio of padded work), then the raw
JSON, under the machine details and the command that produced it. A benchmark that fails is
reported as failed and the others still run (exit status 1).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import click

from gearshift.tools.bench.cli import BENCHMARKS

ORDER = ("policy", "ring", "snapshot", "controller", "hotpath", "optimal", "simulate", "synthetic")
QUICK = {
    "policy": ["--events", "1000000", "--baseline-events", "100000"],
    "ring": ["--seconds", "1"],
    "controller": ["--workers", "2", "--seconds", "1", "--warmup", "0.5"],
    "hotpath": ["--batches", "100"],
    "optimal": ["--values", "2000", "--baseline-values", "500"],
    "synthetic": ["--seeds", "1"],
}
TIMEOUT = 1200.0  # seconds per benchmark
Row = tuple[str, str, str, str]  # figure, value, baseline (same run), ratio
# (figure, key, unit, baseline, baseline key, lower is better)
Spec = tuple[str, str, str, str, str | None, bool]


def _value(x: float, unit: str) -> str:
    if unit == "/s":
        return f"{x / 1e6:,.2f} M/s" if x >= 1e5 else f"{x:,.0f} /s"
    return f"{x:,.3g} {unit}" if x < 100 else f"{x:,.0f} {unit}"


def _rows(result: dict[str, Any], specs: Iterable[Spec]) -> list[Row]:
    rows = []
    for figure, key, unit, baseline, base_key, lower in specs:
        if key not in result:
            continue
        value = _value(result[key], unit)
        if base_key is None or base_key not in result:
            rows.append((figure, value, baseline or "-", "-"))
            continue
        mine, theirs = result[key], result[base_key]
        ratio = theirs / mine if lower else mine / theirs
        rows.append((figure, value, f"{baseline}: {_value(theirs, unit)}", f"{ratio:,.2f}x"))
    return rows


def _policy(r: dict[str, Any]) -> list[Row]:
    specs: list[Spec] = [
        (
            "fold into DimStats, batches of 64 Ki",
            "fold_events_per_second",
            "/s",
            "list-based reference design, record",
            "baseline_record_events_per_second",
            False,
        ),
        (
            "fold, batches of 4 Ki",
            "fold_events_per_second_4ki",
            "/s",
            "list-based reference design, record",
            "baseline_record_events_per_second",
            False,
        ),
    ]
    sizes = sorted(
        {m.group(1) for k in r if (m := re.fullmatch(r"decide_ms_at_(\S+)", k))}, key=float
    )
    for size in sizes:
        base = f"baseline_decide_ms_at_{size}"
        base = base if base in r else f"{base}_extrapolated"
        label = "reference round" + (" (extrapolated)" if base.endswith("extrapolated") else "")
        specs.append(
            (
                f"decision round, {size} events in the window",
                f"decide_ms_at_{size}",
                "ms",
                label,
                base,
                True,
            )
        )
    return _rows(r, specs)


def _ring(r: dict[str, Any]) -> list[Row]:
    n = r.get("workers")
    return _rows(
        r,
        [
            (
                "put, median",
                "put_ns_median",
                "ns",
                "Queue.put",
                "baseline_queue_put_ns_median",
                True,
            ),
            (
                "drain, one consumer",
                "drain_events_per_second",
                "/s",
                "Queue.get",
                "baseline_queue_get_events_per_second",
                False,
            ),
            (
                f"{n} producers -> 1 consumer ({r.get('dropped', 0):,} dropped)",
                "events_per_second",
                "/s",
                f"{n} producers -> one Queue",
                "baseline_queue_events_per_second",
                False,
            ),
        ],
    )


def _snapshot(r: dict[str, Any]) -> list[Row]:
    transfer = dict(r, transfer_us=r["publish_us_median"] + r["read_us_median"])
    return _rows(
        r,
        [
            (
                "version check (has it changed?)",
                "version_check_ns_median",
                "ns",
                "Queue.empty()",
                "baseline_queue_poll_ns_median",
                True,
            ),
        ],
    ) + _rows(
        transfer,
        [
            (
                f"publish + read, {r['payload_bytes']:,} B payload",
                "transfer_us",
                "µs",
                "Queue.put + get",
                "baseline_queue_transfer_us_median",
                True,
            ),
        ],
    )


def _controller(r: dict[str, Any]) -> list[Row]:
    n = r.get("workers")
    return _rows(
        r,
        [
            (
                "ingest.fold",
                "fold_events_per_second",
                "/s",
                "per-event Python fold",
                "baseline_events_per_second",
                False,
            ),
            (
                f"loop, {n} flat-out workers, per CPU second",
                "events_per_second",
                "/s",
                "",
                None,
                False,
            ),
            (
                "the same, a decision round every 0.1 s",
                "events_per_second_busy_rounds",
                "/s",
                "",
                None,
                False,
            ),
            ("decision round p50", "decide_ms_p50", "ms", "", None, True),
            ("decision round max", "decide_ms_max", "ms", "", None, True),
            ("RSS after warm-up", "rss_mb_start", "MB", "", None, True),
            ("RSS at the end", "rss_mb_end", "MB", "", None, True),
        ],
    )


def _hotpath(r: dict[str, Any]) -> list[Row]:
    return _rows(
        r,
        [
            (
                "Profile.route",
                "route_ns_median",
                "ns",
                "seed's in-process design",
                "baseline_inprocess_ns_median",
                True,
            ),
            ("snapshot version check", "version_check_ns_median", "ns", "", None, True),
        ],
    )


def _optimal(r: dict[str, Any]) -> list[Row]:
    return _rows(
        r,
        [
            (
                f"optimal_gears, {r['baseline_values']:,} values, k {r['k']}",
                "dp_ms_at_baseline",
                "ms",
                "quadratic DP",
                "quadratic_ms_at_baseline",
                True,
            ),
            (f"optimal_gears, {r['values']:,} values, k {r['k']}", "dp_ms", "ms", "", None, True),
        ],
    )


def _simulate(r: dict[str, Any]) -> list[Row]:
    """Per trace and dim: padded work of plan and seed mode against the power-of-two ladder,
    and plan mode against the hindsight-optimal static set at its mean gear count."""

    def mode(m: dict[str, Any]) -> str:
        churn = m["adds_per_hour"] + m["evictions_per_hour"]
        return (
            f"{m['padding_overhead']:.1%} pad, {m['mean_gears']:.1f} gears, {churn:.0f} changes/h"
        )

    rows = []
    for trace, dims in r["traces"].items():
        for dim, d in dims.items():
            pow2, best = d["pow2"]["padding_overhead"], d["optimal"]["padding_overhead"]
            where = f"{trace.removeprefix('azure_')} {dim}"
            for name in ("plan", "seed"):
                pad = d[name]["padding_overhead"]
                rows.append(
                    (
                        f"{where}, {name} mode",
                        mode(d[name]),
                        f"pow2: {pow2:.1%} pad",
                        f"{(1 + pow2) / (1 + pad):.2f}x",
                    )
                )
            pad = d["plan"]["padding_overhead"]
            rows.append(
                (
                    f"{where}, plan mode vs hindsight",
                    f"{pad:.1%} pad",
                    f"optimal {d['optimal']['k']} gears: {best:.1%} pad",
                    f"{(1 + best) / (1 + pad):.2f}x",
                )
            )
    return rows


def _synthetic(r: dict[str, Any]) -> list[Row]:
    """Per family: plan mode's padding against the hindsight-optimal static set at its mean
    gear count (rounded; the worst seed)."""
    return [
        (
            f"{family}, plan mode vs hindsight ({r['seeds']} seeds)",
            f"{f['padding_overhead_mean']:.1%} pad, {f['mean_gears_mean']:.1f} gears",
            f"optimal at equal gears (worst seed: plan pads {f['ratio_worst']:.2f}x its padding;"
            f" {f['ratio_held_out_worst']:.2f}x fitted on another draw)",
            f"{1 / f['ratio_worst']:.2f}x",
        )
        for family, f in r["families"].items()
    ]


TABLES: dict[str, Callable[[dict[str, Any]], list[Row]]] = {
    "policy": _policy,
    "ring": _ring,
    "snapshot": _snapshot,
    "controller": _controller,
    "hotpath": _hotpath,
    "optimal": _optimal,
    "simulate": _simulate,
    "synthetic": _synthetic,
}


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
        "times better gearshift's figure is (below 1: worse). Other processes shared the "
        "machine: treat single figures as samples, ratios as the comparison.",
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
    Path(output).write_text(render(sections, invocation, skipped))
    click.echo(f"wrote {output}", err=True)
    if any(result is None for _, result, _, _ in sections):
        sys.exit(1)
