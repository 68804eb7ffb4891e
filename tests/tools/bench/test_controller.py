"""`gearshift bench controller`: the loop's figures at the default cadence and with busy rounds,
and a per-event baseline that folds what `ingest.fold` folds."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from gearshift.controller import ingest
from gearshift.core.config import PolicyConfig
from gearshift.core.round import ProfileLedger
from gearshift.shm import EVENT_DTYPE, Kind
from gearshift.tools.bench.controller import (
    DIMS,
    check_same_fold,
    command,
    draw_sizes,
    fold_per_event,
)


def test_reports_ingest_at_both_cadences_and_the_rounds_it_waited_for() -> None:
    args = ["--workers", "1", "--seconds", "0.5", "--warmup", "0", "--baseline-events", "2000",
            "--min-rounds", "3", "--runs", "2", "--profiles", "3", "--profile-max", "64",
            "--profile-seconds", "0.5"]
    result = CliRunner().invoke(command, [*args, "--json"])
    assert result.exit_code == 0, result.output
    r = json.loads(result.output)
    assert r["events_consumed"] > 0 and r["events_per_second"] > 0
    assert r["events_per_second_busy_rounds"] > 0
    assert r["rounds"] >= 3 and 0 < r["decide_ms_p50"] <= r["decide_ms_max"]
    low, high = r["fold_speedup_range"]
    assert 0 < low <= r["fold_speedup"] <= high
    assert r["state_mb_3"] > 0 and r["save_ms_3"] > 0 and r["rss_mb_peak_3"] > 0
    assert r["stall_ms_p99_3"] <= r["stall_ms_max_3"] and r["events_3"] > 0
    assert 0 < r["distinct_3"] <= 64 and r["dropped_3"] >= 0


def test_the_per_event_baseline_folds_what_ingest_folds() -> None:
    config = PolicyConfig()
    n = 500
    events = np.zeros(n, EVENT_DTYPE)
    events["t_ns"] = np.linspace(0, 30e9, n).astype(np.int64)  # over three slices
    events["values"][:, : len(DIMS)] = draw_sizes(n, 1)
    events["kind"], events["ndim"] = Kind.SHAPE, len(DIMS)
    profile = ProfileLedger.new(DIMS, 0.0, config)
    ingest.fold(events, np.zeros(n, np.int64), [profile], 30.0)
    cells = fold_per_event(events, profile, config)
    check_same_fold(cells, profile, 30.0, config)
    ingest.fold(events, np.zeros(n, np.int64), [profile], 30.0)  # now every event twice
    with pytest.raises(AssertionError):
        check_same_fold(cells, profile, 30.0, config)
