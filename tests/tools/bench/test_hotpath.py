"""`gearshift bench hotpath` runs in a private namespace it removes, and reports its keys."""

from __future__ import annotations

import json
import os

from click.testing import CliRunner

from gearshift.tools.bench.hotpath import DIMS, ReferenceRouter, command


def test_the_reference_baseline_records_one_sample_per_dim_in_its_gears_state() -> None:
    ref = ReferenceRouter(DIMS)
    assert ref.route(BATCHSIZE=130, SEQLEN=700) == {"BATCHSIZE": (64, 64, 2), "SEQLEN": (1024,)}
    assert set(ref._states) == {"BATCHSIZE:64", "SEQLEN:1024"}
    (sample,) = ref._states["BATCHSIZE:64"].samples
    assert (sample.raw, sample.pad, sample.split) == (130, 0.0, (130 - 64) / 130)


def test_bench_reports_json_and_leaves_no_segment() -> None:
    result = CliRunner().invoke(command, ["--batches", "3", "--batch", "50", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) == {
        "route_ns_median",
        "record_ns_median",
        "call_ns_median",
        "version_check_ns_median",
        "baseline_inprocess_ns_median",
        "ratio",
    }
    assert all(data[key] > 0 for key in data)
    assert not [n for n in os.listdir("/dev/shm") if f"bench-hotpath-{os.getpid()}" in n]
