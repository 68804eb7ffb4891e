"""The shm benchmarks run end to end and report every figure with its same-run stand-in,
as median and range over the runs."""

from __future__ import annotations

import json

from click.testing import CliRunner

from gearshift.cli import main


def _run(*args: str) -> dict:
    result = CliRunner().invoke(main, ["bench", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def assert_summarised(out: dict, keys: list[str]) -> None:
    """Each key is a median within its range over the runs."""
    for key in keys:
        low, high = out[f"{key}_range"]
        assert 0 < low <= out[key] <= high, key


def test_bench_ring_reports_figures_and_stand_ins() -> None:
    out = _run("ring", "--workers", "1", "--seconds", "0.3", "--capacity", "4096", "--runs", "2")
    assert (out["workers"], out["runs"]) == (1, 2)
    assert_summarised(out, [
        "events_per_second", "baseline_queue_events_per_second", "put_ns_median",
        "baseline_queue_put_ns_median", "drain_events_per_second",
        "baseline_queue_get_batched_events_per_second", "baseline_queue_get_events_per_second",
        "speedup", "drain_speedup", "drain_speedup_per_item", "put_speedup",
    ])
    # the batched stand-in moves records many at a time: faster than one event per get
    assert out["drain_speedup"] < out["drain_speedup_per_item"]


def test_bench_snapshot_compares_with_a_shared_value_and_a_queue() -> None:
    out = _run("snapshot", "--runs", "2")
    assert out["payload_bytes"] > 1000 and out["runs"] == 2
    assert "baseline_queue_poll_ns_median" not in out  # Queue.empty() is no stand-in
    assert_summarised(out, [
        "version_check_ns_median", "baseline_shared_value_ns_median", "read_us_median",
        "publish_us_median", "transfer_us_median", "baseline_queue_transfer_us_median",
        "version_check_speedup", "transfer_speedup",
    ])
