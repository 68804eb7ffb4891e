"""`gearshift bench policy`: the reference design, ported, behaves as the reference does and
agrees with DimStats on the same events; the bench reports every figure against it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from gearshift.core.config import PolicyConfig
from gearshift.tools.bench.policy import DIMS, check_same, command, fold, reference, traffic
from gearshift.tools.bench.reference import ReferenceRuntime, request_metadata


def runtime(gears: list[int], events: list[tuple[float, int]], window: float) -> ReferenceRuntime:
    r = ReferenceRuntime({"S": gears}, {"window_seconds": window})
    for t, raw in events:
        r.record_event(*request_metadata(r.get_snapshot(), {"S": raw}), t)
    return r


def test_request_metadata_maps_to_the_smallest_covering_gear_else_the_largest() -> None:
    gears = {"S": [16, 64], "B": [1, 2]}
    assert request_metadata(gears, {"S": 40, "B": 3}) == (
        [[3], [40]], [[2], [64]], [[0.0], [24 / 64]], [[1 / 3], [0.0]])  # sorted by type


def test_the_port_decays_with_half_the_window_as_half_life() -> None:
    r = runtime([16, 64], [(0.0, 8), (0.0, 40), (150.0, 80), (150.0, 64)], window=300.0)
    stats = r.build_stats_snapshot(150.0)
    g16, g64 = stats["S:16"], stats["S:64"]
    assert (g16["weighted_hits"], g64["weighted_hits"]) == pytest.approx((0.5, 2.5))
    assert g16["avg_pad_ratio"] == pytest.approx(0.5)
    assert g64["avg_pad_ratio"] == pytest.approx(0.5 * 24 / 64 / 2.5)
    assert g64["avg_split_ratio"] == pytest.approx(16 / 80 / 2.5)
    # the reference counts a pad sample only when it pads: 64 on gear 64 is neither kind
    assert (g64["sample_count"], g64["pad_sample_count"], g64["split_sample_count"]) == (3, 1, 1)
    assert r.build_stats_snapshot(301.0)["S:16"]["sample_count"] == 0  # out of the window


def test_a_round_adds_at_the_median_of_all_the_gears_raw_samples() -> None:
    r = runtime([64, 256], [(0.0, v) for v in (30, 35, 40, 41, 38)], window=600.0)
    assert r.run_once(100.0) == ({"S": [38, 64, 256]}, [])
    assert r.run_once(100.0) is None  # 38 now holds nothing: no candidate left


def test_a_round_evicts_the_lowest_score_unless_the_replacement_loss_blocks_it() -> None:
    # 8 carries its traffic alone: 8s would pad to 64 (loss 0.875 > 0.6); 16 is unused
    blocked = runtime([8, 64], [(0.0, 8)] * 6, window=600.0)
    assert blocked.run_once(400.0) is None
    assert blocked._states["S:8"].last_hit_ts == 400.0  # protected from now on
    evicted = runtime([8, 16, 64], [(0.0, 8)] * 6 + [(0.0, 64)] * 6, window=600.0)
    assert evicted.run_once(400.0) == ({"S": [8, 64]}, ["S:16"])


def test_the_port_and_dimstats_agree_and_the_check_catches_other_events() -> None:
    config = PolicyConfig()
    now = config.window_seconds
    times, values = traffic(3000, now)
    port, calls = reference(times, values, now)
    for call in calls:
        port.record_event(*call)
    check_same(port, fold(config, times, values, 1024), now, config)
    other = {k: np.minimum(v + 1, DIMS[k].max) for k, v in values.items()}
    with pytest.raises(AssertionError):
        check_same(port, fold(config, times, other, 1024), now, config)


def test_bench_reports_every_round_against_the_reference_round() -> None:
    args = ["--events", "20000", "--baseline-events", "2000", "--runs", "2", "--json"]
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for key in ("fold_events_per_second", "baseline_record_events_per_second", "fold_speedup",
                "decide_ms_at_2e2", "decide_seed_ms_at_2e4", "baseline_decide_ms_at_2e2",
                "baseline_decide_ms_at_2e3", "baseline_decide_ms_at_2e4_extrapolated",
                "decide_speedup_at_2e3", "decide_seed_speedup_at_2e4"):
        low, high = data[f"{key}_range"]
        assert 0 < low <= data[key] <= high, key
