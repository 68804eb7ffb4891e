"""`gearshift bench simulate`: plan mode on every shipped trace against both power-of-two
ladders, rules mode at both cadences and the hindsight optimum; the report table."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from gearshift.tools.bench import simulate as bench
from gearshift.tools.bench.priced import bench_priced
from gearshift.tools.bench.simulate import command, markdown, pow2_ceil_gears
from gearshift.tools.trace import Trace, load_trace

# The dims where plan mode misses issue 7's goal (plan / optimum <= 1.25 at the rounded gear
# count), as docs/benchmarks.md ("Plan mode against pow2, rules mode and the optimum") names them:
# exactly these, no others.
MISSED = {("azure_conv_batched", "SEQLEN"), ("azure_conv_prefill", "SEQLEN")}


def test_the_old_ladder_ends_at_the_power_of_two_above_the_largest_value() -> None:
    gears = pow2_ceil_gears(load_trace("azure_code_batched"))
    assert gears["SEQLEN"][-2:] == (4096, 8192) and gears["BATCHSIZE"][-1] == 32  # M: 7437, 20


def _priced_on_three_minutes(trace: Trace) -> dict:
    """The priced part on the first three minutes only (test_priced.py checks its figures;
    on whole traces it takes a minute)."""
    n = int(np.searchsorted(trace.t, trace.t[0] + 180.0))
    return bench_priced(Trace(trace.name, trace.t[:n], {k: v[:n] for k, v in trace.dims.items()}))


def test_plan_mode_on_every_shipped_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "bench_priced", _priced_on_three_minutes)
    result = CliRunner().invoke(command, ["--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert len(data["traces"]) == 6
    missed = set()
    for trace, dims in data["traces"].items():
        for dim, r in dims.items():
            plan, best = r["plan"], r["optimal"]
            where = (trace, dim, r)
            assert best["k"] == round(plan["mean_gears"]) == round(best["mean_gears"])
            # the ladder that ends where plan mode starts pads no more than the one above it
            assert r["pow2"]["padding_overhead"] <= r["pow2_ceil"]["padding_overhead"], where
            # plan mode pads less than pow2 and than rules mode at either cadence
            pad = plan["padding_overhead"]
            assert pad < r["pow2"]["padding_overhead"], where
            assert pad < min(r["seed"]["padding_overhead"], r["seed_60"]["padding_overhead"])
            assert r["seed_margin"] > 1, where
            assert plan["eager_events"] == 0, where  # the largest gear never moves down
            # against the optimum at the unrounded gear count (a mix of the two nearest), and
            # against a set fitted on the other half of the events: within the goal everywhere
            assert r["interpolated_ratio"] <= 1.25 and r["held_out_ratio"] <= 1.25, where
            if r["ratio"] > 1.25:
                missed.add((trace, dim))
    assert missed == MISSED
    assert data["worst_ratio"] == max(r["ratio"] for d in data["traces"].values()
                                      for r in d.values())
    table = markdown(data)
    assert table.count("\n") == 2 + 8 - 1 and "| code_prefill | SEQLEN |" in table
    assert set(data["priced"]) == set(data["traces"])
    assert all(set(data["priced"][t]) == set(dims) for t, dims in data["traces"].items())
    text = CliRunner().invoke(command, ["--trace", "azure_code_decode"]).output
    assert "| code_decode | BATCHSIZE | 5 |" in text and "priced / optimal" in text
