"""`gearshift bench synthetic`: families of unshipped traces against the optimum."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from gearshift.core.config import PolicyConfig
from gearshift.tools.bench.synthetic import FAMILIES, command, run_trace, synthetic


def test_every_family_draws_one_hour_of_valid_sizes() -> None:
    for family, (dim, rate, _) in FAMILIES.items():
        trace = synthetic(family, 0)
        sizes = trace.dims[dim]
        assert list(trace.dims) == [dim] and sizes.min() >= 1 and sizes.max() <= 16384
        assert abs(trace.t.size - rate * 3600) < 6 * np.sqrt(rate * 3600)
        assert np.array_equal(sizes, synthetic(family, 0).dims[dim])  # seeded


def test_the_held_out_optimum_of_the_trace_itself_is_the_hindsight_one() -> None:
    trace = synthetic("bimodal", 3)
    r = run_trace(trace, PolicyConfig(), other=trace)
    assert abs(r["ratio_held_out"] - r["ratio"]) < 1e-9


def test_report_per_family() -> None:
    result = CliRunner().invoke(command, ["--seeds", "1", "--family", "lognormal", "--json"])
    assert result.exit_code == 0, result.output
    r = json.loads(result.output)["families"]["lognormal"]
    assert r["ratio_worst"] == r["ratio_mean"] <= 1.25
    assert r["ratio_interpolated_worst"] <= 1.25  # the goal, at the unrounded gear count too
    assert r["mean_gears_mean"] > 1 and r["padding_overhead_mean"] > 0
    # a set fitted on another draw pads at least the hindsight optimum of as many gears
    assert 0.5 < r["ratio_held_out_worst"] <= r["ratio_worst"] * (1 + 1e-9)
    table = CliRunner().invoke(command, ["--seeds", "1", "--family", "bimodal",
                                         "--no-priced"]).output
    assert table.count("\n") == 3 and table.splitlines()[2].startswith("| bimodal | ")


def test_priced_part_replays_each_family_in_device_seconds() -> None:
    result = CliRunner().invoke(command, ["--seeds", "1", "--family", "zipf batch", "--json"])
    assert result.exit_code == 0, result.output
    levels = json.loads(result.output)["priced"]["zipf batch"]["BATCHSIZE"]
    assert set(levels) == {"0", "5"}
    for r in levels.values():  # never above pow2 or unpriced plan on this family
        assert r["vs_pow2"] <= 1.0 + 1e-9 and r["vs_plan"] <= 1.0
        assert r["ratio"] == r["priced"]["device_overhead"] / r["optimal"]["device_overhead"]
    text = CliRunner().invoke(command, ["--seeds", "1", "--family", "zipf batch"]).output
    assert "| zipf batch | BATCHSIZE | 5 |" in text
