"""`gearshift bench controller`: the loop's figures at the default cadence and with busy rounds."""

from __future__ import annotations

import json

from click.testing import CliRunner

from gearshift.tools.bench.controller import command


def test_reports_ingest_at_both_cadences_rounds_and_the_fold_baseline() -> None:
    args = ["--workers", "1", "--seconds", "0.5", "--warmup", "0", "--baseline-events", "2000"]
    result = CliRunner().invoke(command, [*args, "--json"])
    assert result.exit_code == 0, result.output
    r = json.loads(result.output)
    assert r["events_consumed"] > 0 and r["events_per_second"] > 0
    assert r["events_per_second_busy_rounds"] > 0
    assert r["rounds"] >= 2 and 0 < r["decide_ms_p50"] <= r["decide_ms_max"]
    assert r["fold_speedup"] == r["fold_events_per_second"] / r["baseline_events_per_second"]
