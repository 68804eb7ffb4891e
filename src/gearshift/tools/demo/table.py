"""The table `gearshift demo` prints: the two arms side by side, from `Demo.run()`'s result."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _si(x: float) -> str:
    return f"{x / 1e6:.2f} M" if x >= 1e6 else f"{x / 1e3:.1f} k"


def table(r: dict[str, Any]) -> str:
    """The side-by-side table of `Demo.run()`'s result: per profile when it has more than one,
    then over every profile."""
    profiles = r.get("profiles") or {}
    traces = ""
    if len(profiles) > 1:
        traces = " (" + ", ".join(f"{p}: {f['trace']}" for p, f in profiles.items()) + \
            ", one timeline)"
    lines = [
        f"gearshift demo: {r['trace']}{traces}, {r['requests']:,} requests (1 row in "
        f"{r['stride']:.3g} of {r['rows']:,}), {_workers(r)}; time compressed "
        f"{r['time_compression']:.0f}x (policy windows and intervals x{r['stride']:.3g}, divided "
        f"by it: decision rounds {r['round_interval']:.0f} s of trace apart or more); "
        f"{r['seconds']:.0f} s in all",
        f"model: {r['model']['about']}",
    ]
    if len(profiles) > 1:
        for p, f in profiles.items():
            dims = ", ".join(f["adaptive"]["dims"])
            lines += ["", f"profile {p} ({dims}): {f['trace']}, {f['requests']:,} requests",
                      *_arms(f, dims=True, device=False)]
        lines += ["", "every profile", *_arms(r, dims=False, device=True)]
    else:
        lines += _arms(r, dims=True, device=True)
    return "\n".join(lines + _measured(r))


def _workers(r: dict[str, Any]) -> str:
    tp = r.get("tp", 1)
    if tp == 1:
        return f"{r['workers']} workers"
    return (f"{r['workers']} instance{'s' * (r['workers'] > 1)} of {tp} tensor-parallel ranks"
            f" (gloo; the gears shown are instance 0's)")


def _measured(r: dict[str, Any]) -> list[str]:
    """One plain sentence on what the workers measured and what it decided; the figures
    (fitted curves, the priced decisions' reasons) are --json's."""
    graphs = sum(c["measurements"] for f in (r.get("profiles") or {}).values()
                 for c in (f.get("adaptive", {}).get("measured_costs") or {}).values())
    if not graphs:
        return []
    a = r["adaptive"]
    adds, priced = a.get("adds", 0), a.get("priced_adds", 0)
    decided = (f"{priced} of the {adds} gears added went in because the time they save pays "
               f"for capturing them" if priced
               else f"none of the {adds} gears added was decided on those timings")
    return ["", f"The workers timed the {graphs} graphs they captured; {decided}"
                f"{_held(a.get('graph_bytes'))} (--json has the details)."]


def _held(held: dict[str, Any] | None) -> str:
    """The priced graphs' bytes (with their static buffers, where reported) against the
    bound, as a clause (nothing without them)."""
    if not held or (not held["held"] and held["bound"] is None):
        return ""
    bound = ("no bound" if held["bound"] is None
             else f"a {held['bound'] / 2**20:,.1f} MiB bound")
    buffers = held.get("buffers") or 0.0
    with_buffers = f" (buffers {buffers / 2**20:,.1f} MiB of it)" if buffers > 0 else ""
    return f"; its graphs hold {held['held'] / 2**20:,.1f} MiB{with_buffers} against {bound}"


def _arms(r: dict[str, Any], dims: bool, device: bool) -> list[str]:
    """The rows of `r`'s two arms (per dim if `dims`; the device's and the controller's if
    `device`), and its speedups."""
    a, s = r["adaptive"], r["static"]

    def row(name: str, fmt: Callable[[dict[str, Any]], str]) -> tuple[str, str, str]:
        return name, fmt(a), fmt(s)

    rows = [
        row("wall time, captures included", lambda x: f"{x['seconds']:.1f} s"),
        row("useful tokens per second", lambda x: _si(x["useful_tokens_per_second"])),
        row("useful tokens per CPU second", lambda x: _si(x["useful_tokens_per_cpu_second"])),
        row("padding overhead (tokens)", lambda x: f"{x['padding_overhead']:.1%}"),
    ]
    for d in a["dims"] if dims else ():
        rows += [
            row(f"  {d} padding", lambda x, d=d: f"{x['dims'][d]['padding_overhead']:.1%}"),
            row(f"  {d} gears, mean / final",
                lambda x, d=d: f"{x['dims'][d]['mean_gears']:.1f} / "
                f"{len(x['dims'][d]['final_gears'])}"),
        ]
    rows += [
        row("padding overhead (model compute)", lambda x: f"{x['compute_overhead']:.1%}"),
        row("computed tokens / useful: replays", lambda x: _share(x, "replayed_tokens")),
        row("  captures", lambda x: _share(x, "captured_tokens")),
        row(
            "CPU s: workers / controller",
            lambda x: f"{x['worker_cpu_seconds']:.1f} / {x['controller_cpu_seconds']:.1f}",
        ),
        row("  workers' captures", lambda x: f"{x['capture_cpu_seconds']:.1f}"),
        row("  request CPU µs: model / outside it", _per_request),
        row("  captures' share of workers' CPU", lambda x: f"{x['capture_share']:.1%}"),
        row("adds / evictions", lambda x: f"{x['adds']} / {x['evictions']}"),
        row("  adds priced in measured seconds", lambda x: f"{x['priced_adds']}"),
        row("graph captures (new gears)", lambda x: f"{x['captures']:,}"),
        row("eager runs (no graph ready)", lambda x: f"{x['eager']:,}"),
    ]
    if "compile" in a:
        rows += _compile_rows(row)
    if device and "lockstep" in a:  # tensor parallel: the check outside gearshift
        rows += [
            row("tensor-parallel steps: gears differed", lambda x: _differed(x["lockstep"])),
            row("  outputs checked: off / worst error", lambda x: _checked(x["lockstep"])),
        ]
    if device:
        rows += [
            row(
                "snapshot version",
                lambda x: f"v{x['snapshot_version']}" if x["snapshot_version"] else "-",
            ),
            row("decision rounds", lambda x: _rounds(x["decision_rounds"])),
            row("propagation lag (trace time), mean (n)", lambda x: _lag(x["propagation_lag"])),
            row("peak memory per worker", lambda x: f"{x['worker_peak_rss_mb']:.0f} MB"),
            row("demo process CPU s (not counted)", lambda x: f"{x['demo_cpu_seconds']:.1f}"),
        ]
    width = max(len(name) for name, *_ in rows) + 2
    lines = ["", f"{'':{width}}{'adaptive':>14}{'static':>16}"]
    lines += [f"{name:{width}}{x:>14}{y:>16}" for name, x, y in rows]
    return [
        *lines,
        "",
        f"speedup (useful tokens per second, adaptive / static): {r['speedup']:.2f}x"
        + _slices(r.get("speedup_slices")),
        f"per CPU second (workers and controller; robust to other load): {r['cpu_speedup']:.2f}x"
        + _slices(r.get("cpu_speedup_slices")),
        f"compute-bound ceiling (model cost of the padded work, static / adaptive): "
        f"{r['compute_ratio']:.2f}x",
    ]


def _compile_rows(row: Callable[..., tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The compile backend's rows: compiles before the arm ran and during it."""

    def compiles(part: str) -> Callable[[dict[str, Any]], str]:
        def fmt(x: dict[str, Any]) -> str:
            c = x["compile"][part]
            return (f"{c['compiles']} / {c['compile_cache_misses']} / "
                    f"{c['compile_cache_hits']}")
        return fmt

    return [
        row("compiles: all / cold / cache hits", lambda x: ""),
        row("  before the run (initial gears)", compiles("startup")),
        row("  during the run (new gears)", compiles("run")),
        row("compile wall s: before / during",
            lambda x: f"{x['compile']['startup']['compile_seconds']:.1f} / "
            f"{x['compile']['run']['compile_seconds']:.1f}"),
    ]


def _slices(spread: dict[str, Any] | None) -> str:
    """`; over N interleaved slices: median M (min-max)`, or nothing without slices (a slice
    holds a profile's requests in both arms, or it has no ratio)."""
    if not spread or spread["median"] is None:
        return ""
    return (f"; over {len(spread['slices'])} interleaved slices: median {spread['median']:.2f}x "
            f"({spread['min']:.2f}-{spread['max']:.2f})")


def _differed(c: dict[str, Any]) -> str:
    return f"{c['steps']:,}: {c['differed']}"


def _checked(c: dict[str, Any]) -> str:
    return f"{c['checked']:,}: {c['mismatched']} / {c['worst_error']:.0e}"


def _per_request(x: dict[str, Any]) -> str:
    """A request's CPU µs inside the model and outside it (the request path, the runner)."""
    n = x["requests"]
    if not n:
        return "-"
    model, request = x["model_cpu_seconds"], x["request_cpu_seconds"]
    return f"{model / n * 1e6:,.0f} / {(request - model) / n * 1e6:,.0f}"


def _share(x: dict[str, Any], key: str) -> str:
    return f"{x[key] / x['useful_tokens']:.3f}"


def _rounds(rounds: dict[str, int] | None) -> str:
    return f"{rounds['count']}" if rounds else "-"


def _lag(lag: dict[str, float] | None) -> str:
    return f"{lag['mean_ms']:.0f} ms ({lag['count']})" if lag else "-"
