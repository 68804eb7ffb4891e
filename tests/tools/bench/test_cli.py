"""The shm benchmarks run end to end and report every figure with its same-run baseline."""

from __future__ import annotations

import json

from click.testing import CliRunner

from gearshift.cli import main


def _run(*args: str) -> dict:
    result = CliRunner().invoke(main, ["bench", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_bench_ring_reports_figures_and_baselines() -> None:
    out = _run("ring", "--workers", "1", "--seconds", "0.3", "--capacity", "4096")
    for key in ("events_per_second", "put_ns_median", "drain_events_per_second"):
        assert out[key] > 0
    assert out["dropped"] >= 0
    assert out["speedup"] == out["events_per_second"] / out["baseline_queue_events_per_second"]
    assert out["put_speedup"] == out["baseline_queue_put_ns_median"] / out["put_ns_median"]


def test_bench_snapshot_reports_figures_and_baselines() -> None:
    out = _run("snapshot")
    assert out["payload_bytes"] > 1000
    for key in ("version_check_ns_median", "read_us_median", "publish_us_median"):
        assert out[key] > 0
    assert out["version_check_speedup"] == (
        out["baseline_queue_poll_ns_median"] / out["version_check_ns_median"]
    )
