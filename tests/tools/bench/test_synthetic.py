"""`gearshift bench synthetic`: families of unshipped traces against the optimum."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from gearshift.core.config import PolicyConfig
from gearshift.core.dims import padded_work
from gearshift.tools.bench.synthetic import FAMILIES, command, run_trace, synthetic
from gearshift.tools.simulate import policy_dims, simulate


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
    result = CliRunner().invoke(command, ["--seeds", "1", "--family", "lognormal", "--no-priced",
                                          "--json"])  # the priced part: the test below
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


@pytest.mark.parametrize("name", ["lognormal", "bimodal", "shift halfway", "uniform"])
def test_synthetic_traces_pad_within_a_quarter_of_the_optimum(name: str) -> None:
    """The adaptive policy on a whole trace: within 1.25 x the optimum at its mean gear count,
    bounded churn, no flapping."""
    trace = synthetic(name, 7)
    config = PolicyConfig()
    result = simulate(trace, policy_dims(trace, "adaptive"), config)
    d = result.dims["SEQLEN"]
    k = round(d.mean_gears)
    best = policy_dims(trace, "optimal", k={"SEQLEN": k})["SEQLEN"]
    optimum = padded_work(best.initial_gears, trace.dims["SEQLEN"], False).sum() / d.raw_work - 1
    assert d.padding_overhead <= 1.25 * optimum, (d.padding_overhead, optimum, k)
    assert result.summary()["dims"]["SEQLEN"]["churn_per_hour"] < 120
    evicted: dict[int, float] = {}
    for c in result.changes:
        assert c.reason
        if c.action == "evict":
            evicted[c.gear] = c.t
        elif c.gear in evicted:  # no flapping: never back within the protection window
            assert c.t - evicted[c.gear] >= config.recent_use_protect_seconds, c
