"""`gearshift bench all`: every registered benchmark into one report, figures beside baselines."""

from __future__ import annotations

import json
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

RING = {  # `bench ring --json` keys, as it prints them
    "workers": 2,
    "seconds": 1.0,
    "capacity": 65536,
    "events_per_second": 2.0e6,
    "dropped": 0,
    "baseline_queue_events_per_second": 8.0e4,
    "speedup": 25.0,
    "put_ns_median": 450.0,
    "baseline_queue_put_ns_median": 540.0,
    "put_speedup": 1.2,
    "drain_events_per_second": 4.2e7,
    "baseline_queue_get_events_per_second": 1.8e5,
    "drain_speedup": 233.3,
}
POLICY = {
    "events": 10**6,
    "fold_events_per_second": 1.0e7,
    "fold_events_per_second_4ki": 9.0e6,
    "decide_ms_at_1e4": 0.5,
    "decide_ms_at_1e6": 1.0,
    "baseline_decide_ms_at_1e4": 10.0,
    "baseline_decide_ms_at_1e6_extrapolated": 1000.0,
    "baseline_record_events_per_second": 1.0e6,
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
        ("synthetic", synthetic, ["--seeds", "1", "--family", "uniform", "--family", "spikes"], 2),
    ],
)
def test_tables_read_what_the_benchmarks_print(
    name: str, command: Any, args: list[str], rows: int
) -> None:
    table = report.TABLES[name](real(command, *args))
    assert len(table) == rows
    assert table[0][3].endswith("x") and float(table[0][3][:-1].replace(",", "")) > 0


def test_ratio_is_how_many_times_better_either_way() -> None:
    put, drain, flow = report.TABLES["ring"](RING)
    assert put == ("put, median", "450 ns", "Queue.put: 540 ns", "1.20x")  # lower is better
    assert drain[1:] == ("42.00 M/s", "Queue.get: 0.18 M/s", "233.33x")  # higher is better
    assert flow[0] == "2 producers -> 1 consumer (0 dropped)"
    rounds = report.TABLES["policy"](POLICY)[2:]
    assert [r[0] for r in rounds] == [
        "decision round, 1e4 events in the window",
        "decision round, 1e6 events in the window",
    ]
    assert (
        rounds[1][2] == "reference round (extrapolated): 1,000 ms" and rounds[1][3] == "1,000.00x"
    )


def test_simulate_rows_compare_padded_work() -> None:
    mode = {
        "padding_overhead": 0.1,
        "mean_gears": 8.0,
        "adds_per_hour": 5.0,
        "evictions_per_hour": 6.0,
    }
    dim = {
        "pow2": {**mode, "padding_overhead": 0.43},
        "seed": {**mode, "padding_overhead": 0.2},
        "plan": mode,
        "optimal": {"k": 8, "padding_overhead": 0.1},
    }
    rows = report.TABLES["simulate"]({"traces": {"azure_conv_prefill": {"SEQLEN": dim}}})
    assert rows[0] == (
        "conv_prefill SEQLEN, plan mode",
        "10.0% pad, 8.0 gears, 11 changes/h",
        "pow2: 43.0% pad",
        "1.30x",
    )
    assert rows[1][3] == "1.19x" and rows[2][3] == "1.00x"


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
    assert "| put, median | 450 ns | Queue.put: 540 ns | 1.20x |" in text
    assert "boom" in text and "Not run: `snapshot`" in text
    assert json.dumps(RING) in text
