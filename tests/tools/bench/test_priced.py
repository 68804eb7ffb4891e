"""The priced part of `gearshift bench simulate`: the device-time model per dim, every mode at
every capture level on a short slice of a shipped trace, and its table."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gearshift.core.config import PolicyConfig
from gearshift.core.costs import Line
from gearshift.core.dims import Dim
from gearshift.tools.bench.memory_model import (
    FLOOR_BYTES,
    ROW_BYTES,
    TOKEN_BYTES,
    fitting_after_start,
    fitting_optimum,
    graph_bytes,
)
from gearshift.tools.bench.priced import (
    ATTENTION_S,
    CAPTURE_LEVELS,
    DECODE,
    PREFILL,
    TOKEN_S,
    WEIGHTS_S,
    _after_start,
    _past,
    bench_priced,
    device_costs,
    markdown,
    memory_markdown,
)
from gearshift.tools.simulate import Device, policy_dims, simulate
from gearshift.tools.trace import Trace, load_trace

MODES = ("pow2", "seed", "plan", "priced", "optimal")


def slice_of(name: str, minutes: float) -> Trace:
    trace = load_trace(name)
    n = int(np.searchsorted(trace.t, trace.t[0] + 60 * minutes))
    return Trace(name, trace.t[:n], {k: v[:n] for k, v in trace.dims.items()})


def test_device_costs_model_a_prefill_a_decode_step_and_a_batch_of_prompts() -> None:
    assert device_costs(load_trace("azure_code_prefill")) == {"SEQLEN": PREFILL}
    assert device_costs(load_trace("azure_conv_decode")) == {"BATCHSIZE": DECODE}
    batched = load_trace("azure_code_batched")
    costs = device_costs(batched)
    s = float(np.median(batched.dims["SEQLEN"]))
    assert costs["SEQLEN"] == PREFILL
    assert costs["BATCHSIZE"] == (WEIGHTS_S, pytest.approx(TOKEN_S * s + ATTENTION_S * s * s))
    # every step reads the weights once (milliseconds), a token costs far less
    assert 1e-3 < WEIGHTS_S < 1e-2 and 0 < TOKEN_S < WEIGHTS_S / 100 and DECODE[1] > 0


@pytest.fixture(scope="module")
def priced() -> dict:
    return bench_priced(slice_of("azure_code_batched", 4))


def test_every_dim_level_and_mode_is_reported(priced: dict) -> None:
    assert set(priced) == {"BATCHSIZE", "SEQLEN"}
    for levels in priced.values():
        assert list(levels) == [f"{level:g}" for level in CAPTURE_LEVELS] == ["0", "0.05", "0.5",
                                                                              "5"]
        for row in levels.values():
            assert set(row) == {*MODES, "ratio", "held_out_ratio", "after_start",
                                "vs_after_start", "vs_past", "vs_pow2", "vs_plan", "budget",
                                "device_budget", "fit", "vs_fit", "fit_after_start",
                                "vs_fit_after_start"}
            assert 0 <= row["vs_past"] < math.inf
            assert 0 < row["held_out_ratio"] < math.inf
            p = row["priced"]
            assert row["vs_after_start"] == pytest.approx(p["device_overhead"]
                                                          / row["after_start"])
            assert row["ratio"] == pytest.approx(p["device_overhead"]
                                                 / row["optimal"]["device_overhead"])
            assert row["vs_pow2"] == pytest.approx(p["device_overhead"]
                                                   / row["pow2"]["device_overhead"])
            assert row["vs_plan"] == pytest.approx(p["device_overhead"]
                                                   / row["plan"]["device_overhead"])
            assert row["optimal"]["mean_gears"] == p["mean_gears"]  # at equal mean gears


def test_captures_are_priced_at_each_level(priced: dict) -> None:
    for levels in priced.values():
        for level, row in levels.items():
            seconds = float(level)
            for mode in ("pow2", "seed", "plan", "priced"):
                m = row[mode]
                assert m["capture_seconds"] == pytest.approx(m["captures"] * seconds), mode
                assert m["device_overhead"] >= m["padding_overhead"] - 1e-12
            if seconds == 0:  # free captures: device time is padding alone
                assert all(row[m]["device_overhead"] == pytest.approx(row[m]["padding_overhead"])
                           for m in MODES)
            pow2 = row["pow2"]  # a static set: its gears once, never a change
            assert pow2["captures"] == round(pow2["mean_gears"]) and pow2["changes_per_hour"] == 0
        # the unpriced modes decide alike at every level: only their capture seconds differ
        plans = [row["plan"] for row in levels.values()]
        assert len({(p["captures"], p["padding_overhead"]) for p in plans}) == 1
        # a dearer capture never buys more changes
        churn = [row["priced"]["changes_per_hour"] for row in levels.values()]
        assert churn[-1] <= churn[0]


def test_the_table_has_a_row_per_dim_and_level(priced: dict) -> None:
    table = markdown({"azure_code_batched": priced})
    lines = table.splitlines()
    assert len(lines) == 2 + 2 * len(CAPTURE_LEVELS)
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|") == 15
    row = priced["SEQLEN"]["5"]
    assert lines[-1].startswith("| code_batched | SEQLEN | 5 | ")
    assert lines[-1].endswith(f"| {row['ratio']:.2f} | {row['held_out_ratio']:.2f} "
                              f"| {row['vs_after_start']:.2f} | {row['vs_past']:.2f} "
                              f"| {row['vs_pow2']:.2f} | {row['vs_plan']:.2f} |")


def test_after_start_runs_the_start_up_gears_until_the_first_round_then_the_optimum() -> None:
    # two requests of 3 before the first round (at 15 s), then 5 and 7; start-up gears
    # 1, 2, 4, 7: the early ones pad to 4 (captured), the optimum of two gears is {3, 7}
    trace = Trace("t", np.array([0.0, 1.0, 20.0, 21.0]), {"SEQLEN": np.array([3, 3, 5, 7])})
    dim = Dim(gears=(1, 2, 4, 7), max=7)
    got = _after_start(trace, "SEQLEN", dim, 2.0, 1.0)
    # padded 4 + 4 early and 7 + 7 late, over 18 raw; captures 4, 7 (the largest) and 3
    assert got == pytest.approx((8 + 14 + 3) / 18 - 1)
    assert _after_start(trace, "SEQLEN", dim, 2.0, 0.0) == pytest.approx(22 / 18 - 1)


def test_past_compares_the_second_half_with_the_set_the_first_half_would_have_chosen() -> None:
    # traffic at 100 for two minutes, then at 3000: the first half's best set pads the second
    # half's requests to the largest value, priced mode follows them
    rng = np.random.default_rng(0)
    t = np.sort(rng.uniform(0.0, 240.0, 720))
    values = np.where(t < 120.0, rng.integers(90, 110, t.size), rng.integers(2900, 3100, t.size))
    trace = Trace("shift", t, {"SEQLEN": values.astype(np.int64)})
    dims = policy_dims(trace, "adaptive", cost={"SEQLEN": PREFILL})
    run = simulate(trace, dims, PolicyConfig(), device=Device(Line(0.0), priced=True, lazy=True))
    assert _past(trace, run, "SEQLEN", dims["SEQLEN"]) < 0.5


def test_graph_bytes_model_activations_per_token_and_row_over_a_floor() -> None:
    assert graph_bytes(load_trace("azure_code_prefill")) == {
        "SEQLEN": Line(FLOOR_BYTES, TOKEN_BYTES)}
    assert graph_bytes(load_trace("azure_conv_decode")) == {
        "BATCHSIZE": Line(FLOOR_BYTES, ROW_BYTES)}
    batched = load_trace("azure_code_batched")
    s = float(np.median(batched.dims["SEQLEN"]))
    assert graph_bytes(batched)["BATCHSIZE"] == Line(FLOOR_BYTES, TOKEN_BYTES * s)
    assert FLOOR_BYTES == 2 << 20 and 0 < TOKEN_BYTES < ROW_BYTES


def test_at_equal_memory_priced_runs_within_the_bound_and_the_optimum_fits_it(
        priced: dict) -> None:
    for level in priced["SEQLEN"]:
        rows = [levels[level] for levels in priced.values()]
        device = rows[0]["device_budget"]  # the dims share the device's bound
        assert device == pytest.approx(sum(r["budget"] for r in rows))
        assert sum(r["priced"]["mean_bytes"] for r in rows) <= device
        for row in rows:
            bound, p, fit = row["budget"], row["priced"], row["fit"]
            pow2 = row["pow2"]  # the start: every start-up gear, held at once
            assert bound == pytest.approx(1.25 * pow2["peak_bytes"])
            assert fit["peak_bytes"] <= bound
            assert row["vs_fit"] == pytest.approx(p["device_overhead"] / fit["device_overhead"])
            assert row["vs_fit_after_start"] == pytest.approx(p["device_overhead"]
                                                              / row["fit_after_start"])
    table = memory_markdown({"azure_code_batched": priced}).splitlines()
    assert len(table) == 2 + 2 * len(CAPTURE_LEVELS) and table[0].count("|") == 14


def test_the_fitting_optimum_is_the_best_count_whose_graphs_fit() -> None:
    values, dim = np.array([10, 20, 30, 40] * 5), Dim(max=40)
    line = Line(0.0, 1.0)  # a graph's bytes: its gear
    assert fitting_optimum(values, dim, line, None, 0.0)["mean_gears"] == 4  # no padding
    tight = fitting_optimum(values, dim, line, 60.0, 0.0)  # no 3 gears fit: {20, 40} does
    assert tight["peak_bytes"] == 60.0 and tight["mean_gears"] == 2
    assert fitting_optimum(values, dim, line, None, 1e6)["mean_gears"] == 1  # dear captures


def test_the_fitting_clairvoyant_pays_the_start_up_then_holds_the_fitting_optimum() -> None:
    values, dim = np.array([10, 20, 30, 40] * 5), Dim(gears=(8, 16, 32, 64), max=64)
    line, early = Line(0.0, 1.0), np.zeros(20, bool)
    early[:4] = True  # 10, 20, 30, 40 before the first round: on 16, 32, 32, 64
    raw = float(values.sum())
    head = 16 + 32 + 32 + 64
    # unbounded, no capture cost: then the four values themselves, no padding
    assert fitting_after_start(values, early, dim, line, None, 0.0) == pytest.approx(
        (head + 16 * 25) / raw - 1.0)
    # 60 bytes hold {20, 40}; captures: 16, 32, 64 reached at the start, then 20 and 40
    assert fitting_after_start(values, early, dim, line, 60.0, 1.0) == pytest.approx(
        (head + 8 * 20 + 8 * 40 + 5) / raw - 1.0)
