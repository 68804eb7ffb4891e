"""`gearshift bench simulate`: the report table's figures, and plan mode on every shipped trace."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from gearshift.tools.bench.simulate import command, markdown

# Dims where plan mode misses issue 7's goal (ratio <= 1.25), with the ratio they stay within.
MISSED = {("azure_conv_batched", "SEQLEN"): 1.3, ("azure_conv_prefill", "SEQLEN"): 1.3}


def test_plan_mode_on_every_shipped_trace() -> None:
    result = CliRunner().invoke(command, ["--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert len(data["traces"]) == 6
    for trace, dims in data["traces"].items():
        for dim, r in dims.items():
            plan, best = r["plan"], r["optimal"]
            assert best["k"] == round(plan["mean_gears"])
            assert r["ratio"] == pytest.approx(plan["padding_overhead"] / best["padding_overhead"])
            assert plan["padding_overhead"] < r["seed"]["padding_overhead"], (trace, dim)
            assert plan["eager_events"] == 0, (trace, dim)  # the largest gear never moves down
            # against the optimum at the unrounded gear count (a mix of the two nearest), and
            # against a set fitted on the other half of the events: within the goal everywhere
            assert r["interpolated_ratio"] <= 1.25 and r["held_out_ratio"] <= 1.25, (trace, dim, r)
            if (trace, dim) in MISSED:  # issue 7's goal is missed here (docs/policy.md, Report)
                assert r["ratio"] <= MISSED[trace, dim], (trace, dim, r)
            else:
                assert r["ratio"] <= 1.25, (trace, dim, r)
    assert data["worst_ratio"] == max(r["ratio"] for d in data["traces"].values()
                                      for r in d.values())
    table = markdown(data)
    assert table.count("\n") == 2 + 8 - 1 and "| code_prefill | SEQLEN |" in table
