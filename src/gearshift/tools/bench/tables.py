"""The table of each benchmark in the report: its figures next to their baselines.

A row is (figure, value, baseline measured in the same run, ratio); the ratio is the factor by
which gearshift's figure is better (below 1: worse); for padding, the ratio of padding
overheads (baseline / gearshift), except in rows "vs hindsight", which give plan / optimum
(over 1: plan pads more). A figure measured over several runs shows its median and its range,
`median (min-max)`, and its ratio the median and range of the run-by-run ratios (`spread`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

Row = tuple[str, str, str, str]  # figure, value, baseline (same run), ratio
# (figure, key, unit, baseline, baseline key, lower is better[, key of the run-by-run ratio])
Spec = tuple[str, str, str, str, str | None, bool] | tuple[str, str, str, str, str | None, bool,
                                                          str]


def _value(x: float, unit: str) -> str:
    if unit == "/s":
        return f"{x / 1e6:,.2f} M/s" if x >= 1e5 else f"{x:,.0f} /s"
    return f"{x:,.3g} {unit}" if x < 100 else f"{x:,.0f} {unit}"


def _cell(result: dict[str, Any], key: str, unit: str) -> str:
    """The figure, with its range over the runs when it has one."""
    span = result.get(f"{key}_range")
    value = _value(result[key], unit)
    if not span:
        return value
    low, high = (_value(x, unit).removesuffix(f" {unit}").removesuffix(" M/s") for x in span)
    return f"{value} ({low}–{high})"


def _ratio(result: dict[str, Any], key: str) -> str:
    span = result.get(f"{key}_range")
    return f"{result[key]:,.2f}x" + (f" ({span[0]:,.2f}–{span[1]:,.2f})" if span else "")


def _rows(result: dict[str, Any], specs: Iterable[Spec]) -> list[Row]:
    rows = []
    for figure, key, unit, baseline, base_key, lower, *paired in specs:
        if key not in result:
            continue
        value = _cell(result, key, unit)
        if base_key is None or base_key not in result:
            rows.append((figure, value, baseline or "-", "-"))
            continue
        if paired and paired[0] in result:
            ratio = _ratio(result, paired[0])
        else:
            mine, theirs = result[key], result[base_key]
            ratio = f"{theirs / mine if lower else mine / theirs:,.2f}x"
        rows.append((figure, value, f"{baseline}: {_cell(result, base_key, unit)}", ratio))
    return rows


def _policy(r: dict[str, Any]) -> list[Row]:
    record = "reference design (ported), record_event"
    specs: list[Spec] = [
        ("fold into DimStats, batches of 64 Ki", "fold_events_per_second", "/s", record,
         "baseline_record_events_per_second", False, "fold_speedup"),
        ("fold, batches of 4 Ki", "fold_events_per_second_4ki", "/s", record,
         "baseline_record_events_per_second", False, "fold_speedup_4ki"),
    ]
    sizes = sorted(
        {m.group(1) for k in r if (m := re.fullmatch(r"decide_ms_at_([0-9e]+)", k))}, key=float
    )
    for size in sizes:
        base = f"baseline_decide_ms_at_{size}"
        base = base if base in r else f"{base}_extrapolated"
        label = "reference round, run_once" + (
            " (extrapolated)" if base.endswith("extrapolated") else "")
        for mode, name in (("", "plan"), ("_seed", "rules")):
            specs.append((
                f"decision round, {name} mode, {size} events in the window",
                f"decide{mode}_ms_at_{size}", "ms", label, base, True,
                f"decide{mode}_speedup_at_{size}",
            ))
    return _rows(r, specs)


def _ring(r: dict[str, Any]) -> list[Row]:
    n = r.get("workers")
    return _rows(
        r,
        [
            ("put, median", "put_ns_median", "ns", "Queue.put (per event)",
             "baseline_queue_put_ns_median", True, "put_speedup"),
            ("drain, one consumer", "drain_events_per_second", "/s",
             "Queue.get of 1024-record arrays", "baseline_queue_get_batched_events_per_second",
             False, "drain_speedup"),
            ("drain, against a per-item stand-in", "drain_events_per_second", "/s",
             "Queue.get per event",
             "baseline_queue_get_events_per_second", False, "drain_speedup_per_item"),
            (f"{n} producers -> 1 consumer ({r.get('dropped', 0):,} dropped)",
             "events_per_second", "/s", f"{n} producers -> one Queue, per event",
             "baseline_queue_events_per_second", False, "speedup"),
        ],
    )


def _snapshot(r: dict[str, Any]) -> list[Row]:
    transfer = r if "transfer_us_median" in r else dict(
        r, transfer_us_median=r["publish_us_median"] + r["read_us_median"])
    return _rows(
        r,
        [
            ("version check (has it changed?)", "version_check_ns_median", "ns",
             "read of a shared Value(lock=False)", "baseline_shared_value_ns_median", True,
             "version_check_speedup"),
        ],
    ) + _rows(
        transfer,
        [
            (f"publish + read, {r['payload_bytes']:,} B payload", "transfer_us_median", "µs",
             "multiprocessing.Queue put + get", "baseline_queue_transfer_us_median", True,
             "transfer_speedup"),
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
                "fold_speedup",
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
    ) + [row for p in _cases(r) for row in _many_profiles(r, p)]


def _cases(r: dict[str, Any]) -> list[str]:
    """The profile counts of the many-profiles cases in a result."""
    return [k.removeprefix("state_mb_") for k in r if re.fullmatch(r"state_mb_\d+", k)]


def _many_profiles(r: dict[str, Any], p: str) -> list[Row]:
    return _rows(
        r,
        [
            (f"{p} profiles: state file", f"state_mb_{p}", "MB",
             "dense rows (format 1), same statistics", f"state_dense_mb_{p}", True),
            (f"{p} profiles: statistics in memory", f"stats_mb_{p}", "MB",
             "dense rows, same statistics", f"state_dense_mb_{p}", True),
            (f"{p} profiles: a full save", f"save_ms_{p}", "ms", "", None, True),
            (f"{p} profiles: a save's part on the loop, max", f"save_loop_ms_max_{p}", "ms", "",
             None, True),
            (f"{p} profiles: longest loop iteration", f"stall_ms_max_{p}", "ms", "", None, True),
            (f"{p} profiles: longest decision round", f"round_ms_max_{p}", "ms", "", None, True),
            (f"{p} profiles: graceful stop", f"stop_ms_{p}", "ms", "", None, True),
            (f"{p} profiles: peak RSS", f"rss_mb_peak_{p}", "MB", "", None, True),
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
                "reference's in-process design",
                "baseline_inprocess_ns_median",
                True,
            ),
            ("snapshot version check", "version_check_ns_median", "ns", "", None, True),
        ],
    )


def _step(r: dict[str, Any]) -> list[Row]:
    """Per gearshift arm of `bench step`: µs per step, wall / CPU, against its static arm."""
    rows = []
    suffix = "_minus_static_cpu_us"
    for arm in (k.removesuffix(suffix) for k in r if k.endswith(suffix)):
        base = "static_compiled" if arm.startswith("compile") else "static"
        mine, theirs = (f"{r[f'{a}_wall_us']:.1f} / {r[f'{a}_cpu_us']:.1f} us" for a in (arm, base))
        ratio = r[f"{base}_cpu_us"] / r[f"{arm}_cpu_us"]
        rows.append((f"{arm}, wall / CPU per step", mine, f"{base}: {theirs}", f"{ratio:.2f}x"))
    return rows


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
                "speedup_at_baseline",
            ),
            (f"optimal_gears, {r['values']:,} values, k {r['k']}", "dp_ms", "ms", "", None, True),
        ],
    )


def _simulate(r: dict[str, Any]) -> list[Row]:
    """Per trace and dim: plan mode's padding against both power-of-two ladders and rules mode
    at both cadences (baseline / plan, against the stronger one), and against the hindsight-
    optimal static set at its mean gear count, rounded and interpolated (plan / optimum)."""

    def mode(m: dict[str, Any]) -> str:
        churn = m["adds_per_hour"] + m["evictions_per_hour"]
        return (
            f"{m['padding_overhead']:.1%} pad, {m['mean_gears']:.1f} gears, {churn:.0f} changes/h"
        )

    rows = []
    for trace, dims in r["traces"].items():
        for dim, d in dims.items():
            pad = d["plan"]["padding_overhead"]
            pow2, ceil = d["pow2"]["padding_overhead"], d["pow2_ceil"]["padding_overhead"]
            seed, seed_60 = d["seed"]["padding_overhead"], d["seed_60"]["padding_overhead"]
            o = d["optimal"]
            where = f"{trace.removeprefix('azure_')} {dim}"
            rows += [
                (f"{where}, plan mode vs pow2", mode(d["plan"]),
                 f"pow2 to M (the start): {pow2:.1%} pad; to 2^k >= M: {ceil:.1%}",
                 f"{pow2 / pad:.2f}x"),
                (f"{where}, plan mode vs rules mode", f"{pad:.1%} pad",
                 f"seed, every 300 s: {seed:.1%} pad; every 60 s: {seed_60:.1%}",
                 f"{d['seed_margin']:.2f}x"),
                (f"{where}, plan mode vs hindsight (plan / optimum)", f"{pad:.1%} pad",
                 f"optimal {o['k']} gears: {o['padding_overhead']:.1%} pad; interpolated at "
                 f"{o['mean_gears']:.2f}: {o['interpolated_padding_overhead']:.1%}",
                 f"{d['ratio']:.2f} (interpolated {d['interpolated_ratio']:.2f})"),
            ]
    return rows + _priced(r.get("priced", {}))


def _priced(traces: dict[str, Any]) -> list[Row]:
    """Per trace, dim and capture cost: priced plan mode's device overhead against unpriced
    plan mode, pow2 and the hindsight optimum at equal mean gears (priced / baseline, as the
    "vs hindsight" rows: over 1 worse)."""

    def mode(m: dict[str, Any]) -> str:
        return (f"{m['device_overhead']:.1%} device, {m['mean_gears']:.1f} gears, "
                f"{m['changes_per_hour']:.0f} changes/h")

    rows = []
    for trace, dims in traces.items():
        for dim, levels in dims.items():
            for level, d in levels.items():
                rows.append((
                    f"{trace.removeprefix('azure_')} {dim} at {level} s a capture, priced vs "
                    "hindsight (priced / unpriced plan; / pow2; / optimum; / after start-up; "
                    "/ past, 2nd half)",
                    mode(d["priced"]),
                    f"unpriced plan {d['plan']['device_overhead']:.1%}; pow2 "
                    f"{d['pow2']['device_overhead']:.1%}; optimal "
                    f"{d['optimal']['device_overhead']:.1%}; after start-up "
                    f"{d['after_start']:.1%}",
                    f"{d['vs_plan']:.2f}x; {d['vs_pow2']:.2f}x; {d['ratio']:.2f}x; "
                    f"{d['vs_after_start']:.2f}x; {d['vs_past']:.2f}x"))
    return rows


def _synthetic(r: dict[str, Any]) -> list[Row]:
    """Per family: plan mode's padding against the hindsight-optimal static set at its mean
    gear count, worst seed, plan / optimum: rounded, interpolated, fitted on another draw."""
    return [
        (
            f"{family}, plan mode vs hindsight (plan / optimum, {r['seeds']} seeds)",
            f"{f['padding_overhead_mean']:.1%} pad, {f['mean_gears_mean']:.1f} gears",
            f"optimal at equal gears, worst seed: interpolated {f['ratio_interpolated_worst']:.2f};"
            f" fitted on another draw {f['ratio_held_out_worst']:.2f}",
            f"{f['ratio_worst']:.2f}",
        )
        for family, f in r["families"].items()
    ] + _priced(r.get("priced", {}))


TABLES: dict[str, Callable[[dict[str, Any]], list[Row]]] = {
    "policy": _policy,
    "ring": _ring,
    "snapshot": _snapshot,
    "controller": _controller,
    "hotpath": _hotpath,
    "step": _step,
    "optimal": _optimal,
    "simulate": _simulate,
    "synthetic": _synthetic,
}


def _graphs(r: dict[str, Any]) -> list[Row]:
    """Graphs on a device (`bench graphs`): replay against eager, memory per graph and returned
    against one shared pool, latency beside captures against idle, outputs and adoption."""
    rows = [
        (f"decode batch {b}: runner.run (pad, replay, cut)", f"{d['graph_us']:,.0f} us",
         f"eager model: {d['eager_us']:,.0f} us", f"{d['speedup']:.2f}x")
        for b, d in r["speed"].items()
    ]
    mean, top = r["capture_seconds_mean"] * 1e3, r["capture_seconds_max"] * 1e3
    rows.append((f"capture, per graph ({r['graphs']} graphs)",
                 f"{mean:,.1f} ms (max {top:,.1f})", "-", "-"))
    if r.get("graph_bytes_total") is not None:
        mib = 1 << 20
        rows.append(("device memory of the graphs, a pool each",
                     f"{r['graph_bytes_total'] / mib:,.1f} MiB",
                     f"one shared pool: {r['shared_pool_bytes'] / mib:,.1f} MiB",
                     f"{r['shared_pool_bytes'] / max(r['graph_bytes_total'], 1):.2f}x"))
        rows.append((f"memory back after releasing {r['released_graphs']} graphs",
                     f"{r['memory_returned_bytes'] / mib:,.1f} MiB of"
                     f" {r['released_graph_bytes'] / mib:,.1f} held",
                     f"one shared pool: {r['shared_pool_returned_bytes'] / mib:,.1f} MiB",
                     f"{r['memory_returned_ratio']:.2f} of held"))
    idle, busy = r["latency"]["idle"], r["latency"]["capturing"]
    for q in ("p50", "p99"):
        rows.append((f"request latency {q}, beside captures and releases",
                     f"{busy[f'{q}_ms']:.3f} ms", f"idle: {idle[f'{q}_ms']:.3f} ms",
                     f"{idle[f'{q}_ms'] / busy[f'{q}_ms']:.2f}x"))
    rows.append(("outputs unlike eager / errors", f"{r['mismatches']} / {r['errors']}",
                 f"max abs error {r['max_abs_error']:.2g} (rtol, atol {r['tolerance']['rtol']:g})",
                 "-"))
    if "adoption" in r:
        a = r["adoption"]
        lag = "-" if a["lag_seconds_max"] is None else f"{a['lag_seconds_max']:.2f} s"
        rows.append(("2 workers, one device: versions acked by both, lag max",
                     f"{a['versions_acked']} of {a['versions_wanted']}, {lag}",
                     f"errors {a['errors']}", "-"))
    return rows


TABLES["graphs"] = _graphs


def _fuzz(r: dict[str, Any]) -> list[Row]:
    """One row per boundary: cases and typed refusals; the failures (each must be 0)."""
    boundaries = dict.fromkeys(key.rsplit(".", 1)[0] for key in r)
    rows = []
    for name in boundaries:
        figures = {k.rsplit(".", 1)[1]: v for k, v in r.items() if k.rsplit(".", 1)[0] == name}
        failed = {k: v for k, v in figures.items() if k not in ("cases", "refused")}
        rows.append((name, f"{figures['cases']} cases, {figures['refused']} refused",
                     ", ".join(f"{k} {v}" for k, v in failed.items()),
                     "clean" if not any(v for k, v in failed.items() if k != "interrupted")
                     else "FAILED"))
    return rows


TABLES["fuzz"] = _fuzz


def _compile(r: dict[str, Any]) -> list[Row]:
    """N workers compiling one new gear at once: the node's shared cache and per-shape lock
    against a cold cache each."""
    n, cold = r["workers"], "a cold cache each"
    return _rows(r, [
        (f"seconds to the gear's graph, 1st of {n} workers", "shared_first_seconds", "s", cold,
         "private_first_seconds", True),
        (f"seconds to the gear's graph, workers 2..{n} (median)", "shared_others_seconds", "s",
         cold, "private_others_seconds", True),
        ("CPU seconds of all workers (C++ compiler included)", "shared_cpu_seconds", "s", cold,
         "private_cpu_seconds", True),
    ])


TABLES["compile"] = _compile
