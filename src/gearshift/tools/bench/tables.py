"""The table of each benchmark in the report: its figures next to their baselines.

A row is (figure, value, baseline measured in the same run, ratio); the ratio is the factor by
which gearshift's figure is better (below 1: worse), for padding the ratio of padded work.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

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
