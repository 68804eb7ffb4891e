"""`gearshift bench all`: every registered benchmark into one report, figures beside baselines."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gearshift.tools.bench import report
from gearshift.tools.bench.cli import BENCHMARKS
from gearshift.tools.bench.hotpath import command as hotpath
from gearshift.tools.bench.optimal import command as optimal
from gearshift.tools.bench.snapshot import command as snapshot
from gearshift.tools.bench.synthetic import command as synthetic

RING = {  # `bench ring --json` keys, as it prints them (one run: no ranges)
    "workers": 2,
    "seconds": 1.0,
    "capacity": 65536,
    "runs": 1,
    "dropped": 0,
    "events_per_second": 2.0e6,
    "baseline_queue_events_per_second": 8.0e4,
    "speedup": 25.0,
    "put_ns_median": 450.0,
    "baseline_queue_put_ns_median": 540.0,
    "put_speedup": 1.2,
    "drain_events_per_second": 4.2e7,
    "baseline_queue_get_batched_events_per_second": 8.4e6,
    "baseline_queue_get_events_per_second": 1.8e5,
    "drain_speedup": 5.0,
    "drain_speedup_per_item": 233.3,
}
POLICY = {
    "events": 10**6,
    "runs": 3,
    "fold_events_per_second": 1.0e7,
    "fold_events_per_second_range": [9.0e6, 1.1e7],
    "fold_events_per_second_4ki": 9.0e6,
    "decide_ms_at_1e4": 0.5,
    "decide_seed_ms_at_1e4": 0.1,
    "decide_ms_at_1e6": 1.0,
    "baseline_decide_ms_at_1e4": 10.0,
    "baseline_decide_ms_at_1e6_extrapolated": 1000.0,
    "baseline_record_events_per_second": 1.0e6,
    "fold_speedup": 10.5,
    "fold_speedup_range": [9.0, 11.0],
    "decide_speedup_at_1e6": 900.0,
    "decide_speedup_at_1e6_range": [800.0, 1100.0],
}


def real(command: Any, *args: str) -> dict[str, Any]:
    result = CliRunner().invoke(command, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_every_registered_benchmark_has_a_table() -> None:
    assert set(BENCHMARKS) - {"all"} <= set(report.TABLES)
    assert set(report.ORDER) <= set(report.TABLES)


@pytest.mark.parametrize(
    ("name", "command", "args", "rows"),
    [
        ("optimal", optimal, ["--values", "300", "--baseline-values", "100"], 2),
        ("hotpath", hotpath, ["--batches", "5", "--batch", "20"], 2),
        ("snapshot", snapshot, [], 2),
        ("synthetic", synthetic,
         ["--seeds", "1", "--family", "zipf batch", "--family", "step batch"], 6),
    ],
)
def test_tables_read_what_the_benchmarks_print(
    name: str, command: Any, args: list[str], rows: int
) -> None:
    table = report.TABLES[name](real(command, *args))
    assert len(table) == rows
    number = r"(\d[\d,]*\.\d+)"
    ratio = re.match(rf"{number}x?(?: \({number}–{number}\))?", table[0][3])
    assert ratio, table[0][3]
    median, *span = (float(x.replace(",", "")) for x in ratio.groups() if x)
    assert median > 0 and (not span or span[0] <= median <= span[1]), table[0][3]


def test_ratio_is_how_many_times_better_either_way() -> None:
    put, batched, per_item, flow = report.TABLES["ring"](RING)
    assert put == ("put, median", "450 ns", "Queue.put (per event): 540 ns", "1.20x")  # lower
    assert per_item[1:] == ("42.00 M/s", "Queue.get per event: 0.18 M/s", "233.30x")  # higher
    assert batched[2:] == ("Queue.get of 1024-record arrays: 8.40 M/s", "5.00x")
    assert flow[0] == "2 producers -> 1 consumer (0 dropped)"


def test_a_figure_over_runs_shows_its_median_and_range_and_its_run_by_run_ratio() -> None:
    fold, fold_4ki, *rounds = report.TABLES["policy"](POLICY)
    assert fold[1] == "10.00 M/s (9.00–11.00)" and fold[3] == "10.50x (9.00–11.00)"
    assert fold_4ki[1] == "9.00 M/s" and fold_4ki[3] == "9.00x"  # no run-by-run ratio: medians
    assert [r[0] for r in rounds] == [
        "decision round, plan mode, 1e4 events in the window",
        "decision round, rules mode, 1e4 events in the window",
        "decision round, plan mode, 1e6 events in the window",
    ]
    assert rounds[2][2] == "reference round, run_once (extrapolated): 1,000 ms"
    assert rounds[2][3] == "900.00x (800.00–1,100.00)"


def test_simulate_rows_compare_padding_overheads() -> None:
    mode = {
        "padding_overhead": 0.1,
        "mean_gears": 8.0,
        "adds_per_hour": 5.0,
        "evictions_per_hour": 6.0,
    }
    dim = {
        "pow2": {**mode, "padding_overhead": 0.40},
        "pow2_ceil": {**mode, "padding_overhead": 0.43},
        "seed": {**mode, "padding_overhead": 0.2},
        "seed_60": {**mode, "padding_overhead": 0.15},
        "plan": mode,
        "seed_margin": 1.5,
        "optimal": {"k": 8, "padding_overhead": 0.08, "mean_gears": 8.4,
                    "interpolated_padding_overhead": 0.09},
        "ratio": 1.25,
        "interpolated_ratio": 1.11,
    }
    vs_pow2, vs_seed, vs_hindsight = report.TABLES["simulate"](
        {"traces": {"azure_conv_prefill": {"SEQLEN": dim}}})
    assert vs_pow2 == (
        "conv_prefill SEQLEN, plan mode vs pow2",
        "10.0% pad, 8.0 gears, 11 changes/h",
        "pow2 to M (the start): 40.0% pad; to 2^k >= M: 43.0%",
        "4.00x",  # against the ladder that ends where plan mode starts
    )
    assert vs_seed[2:] == ("seed, every 300 s: 20.0% pad; every 60 s: 15.0%", "1.50x")
    assert vs_hindsight[0].endswith("vs hindsight (plan / optimum)")
    assert vs_hindsight[2:] == (
        "optimal 8 gears: 8.0% pad; interpolated at 8.40: 9.0%", "1.25 (interpolated 1.11)")


def test_command_writes_the_report_and_fails_when_a_benchmark_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(report, "BENCHMARKS", {"all": "", "ring": "", "policy": "", "extra": ""})

    def fake(name: str, quick: bool) -> tuple[dict[str, Any] | None, str, float]:
        command = f"gearshift bench {name} --json" + (" --quick-args" if quick else "")
        if name == "extra":
            return None, f"{command}\n\nfailed (exit status 1):\nboom", 0.5
        return {"ring": RING, "policy": POLICY}[name], command, 2.0

    monkeypatch.setattr(report, "run", fake)
    out = tmp_path / "docs" / "benchmarks.md"
    result = CliRunner().invoke(report.command, ["--quick", "--output", str(out)])
    assert result.exit_code == 1
    text = out.read_text()
    assert text.startswith("# Benchmarks") and "`gearshift bench all --quick`" in text
    assert "| Python |" in text and "| torch |" in text and "| CPU |" in text
    assert text.index("## policy") < text.index("## ring") < text.index("## extra")
    assert "| put, median | 450 ns | Queue.put (per event): 540 ns | 1.20x |" in text
    assert "boom" in text and "Not run: `snapshot`" in text
    assert json.dumps(RING) in text


def test_the_hand_written_tail_of_a_report_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks.md"
    assert report.kept_tail(out) == ""  # no report yet
    out.write_text("# Benchmarks\n\ngenerated\n")
    assert report.kept_tail(out) == ""  # no marker: nothing is kept
    out.write_text(f"# Benchmarks\n\ngenerated\n\n{report.KEPT}\n\n## By hand\n\nthree runs\n")
    tail = report.kept_tail(out)
    assert tail.startswith("\n" + report.KEPT) and tail.endswith("three runs\n")
    assert "generated" not in tail
