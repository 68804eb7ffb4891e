"""`gearshift bench policy` runs, cross-checks the list baseline, and reports its keys."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gearshift.core.config import PolicyConfig
from gearshift.tools.bench.policy import Baseline, command


def test_baseline_recomputes_from_its_sample_lists() -> None:
    b = Baseline((16, 64))
    for t, raw in [(0.0, 8), (0.0, 40), (150.0, 80), (150.0, 64)]:
        b.record(t, raw)
    (g16, hit16, pad16, _, med16), (g64, hit64, pad64, split64, med64) = b.stats(
        150.0, PolicyConfig(policy_mode="seed"))
    assert (g16, g64, med16, med64) == (16, 64, 8, 52)
    assert (hit16, hit64) == pytest.approx((0.5 / 3, 2.5 / 3))  # t=0 weighs 0.5 at t=150
    assert pad16 == pytest.approx(0.5)
    assert pad64 == pytest.approx(0.5 * 24 / 64 / 2.5)
    assert split64 == pytest.approx(16 / 80 / 2.5)


def test_bench_reports_json() -> None:
    result = CliRunner().invoke(
        command, ["--events", "20000", "--baseline-events", "2000", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for key in ("fold_events_per_second", "decide_ms_at_2e2", "decide_ms_at_2e3",
                "decide_ms_at_2e4", "baseline_decide_ms_at_2e3", "decide_speedup_at_2e4"):
        assert data[key] > 0, key
    assert data["decide_speedup_at_2e4"] == pytest.approx(
        data["baseline_decide_ms_at_2e4_extrapolated"] / data["decide_ms_at_2e4"])
