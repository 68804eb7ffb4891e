"""Trace replay: gear sets per policy, padded work against a direct computation, cadence."""

from __future__ import annotations

import numpy as np
import pytest

from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim, chunks_for
from gearshift.core.optimal import optimal_gears
from gearshift.errors import ShapeError, TraceError
from gearshift.tools.simulate import policy_dims, simulate
from gearshift.tools.trace import Trace, load_trace

SEED = PolicyConfig(policy_mode="seed")  # the replay mechanics, checked against seed 000 rules


def make_trace(t: list[float], **dims: list[int]) -> Trace:
    return Trace("synthetic", np.array(t, float), {k: np.array(v) for k, v in dims.items()})


def test_default_dims_end_at_the_trace_maximum() -> None:
    trace = make_trace([0, 1, 2], BATCHSIZE=[3, 56, 1], SEQLEN=[9000, 2, 14050])
    dims = policy_dims(trace, "adaptive")
    assert dims["BATCHSIZE"] == Dim(gears=(1, 2, 4, 8, 16, 32, 56), max=56, splittable=True)
    assert dims["SEQLEN"].gears == Dim(max=14050).initial_gears
    assert dims["SEQLEN"].gears[-1] == dims["SEQLEN"].max == 14050
    assert not dims["SEQLEN"].splittable
    assert policy_dims(trace, "static") == dims


def test_pow2_dims_end_where_the_adaptive_start_ends() -> None:
    trace = make_trace([0, 1, 2], BATCHSIZE=[3, 56, 1], SEQLEN=[9000, 2, 14050])
    dims = policy_dims(trace, "pow2")
    assert dims["BATCHSIZE"] == Dim(gears=(1, 2, 4, 8, 16, 32, 56), max=56, splittable=True)
    assert dims["SEQLEN"].gears[-2:] == (8192, 14050) and dims["SEQLEN"].max == 14050
    assert dims == policy_dims(trace, "adaptive")  # the same top, the same ladder


def test_given_gears_and_splittable_override() -> None:
    trace = make_trace([0, 1], SEQLEN=[100, 3000])
    dims = policy_dims(trace, "static", gears={"SEQLEN": (512, 8192)}, splittable={"SEQLEN": True})
    assert dims["SEQLEN"] == Dim(gears=(512, 8192), max=8192, splittable=True)
    assert policy_dims(trace, "static", gears={"SEQLEN": (64,)})["SEQLEN"].max == 3000


def test_optimal_dims_use_k_or_the_ladder_count() -> None:
    trace = load_trace("azure_code_batched")
    dims = policy_dims(trace, "optimal", k={"SEQLEN": 5})
    assert dims["SEQLEN"].gears == optimal_gears(trace.dims["SEQLEN"], 5)
    assert dims["BATCHSIZE"].gears == optimal_gears(trace.dims["BATCHSIZE"], 6)  # 1..32


def test_cost_prices_the_dims_and_the_optimum() -> None:
    trace = load_trace("azure_code_prefill")
    steep = (0.0, 1.0, 0.01)
    dims = policy_dims(trace, "optimal", k={"SEQLEN": 4}, cost={"SEQLEN": steep})
    flat = policy_dims(trace, "optimal", k={"SEQLEN": 4})["SEQLEN"]
    assert dims["SEQLEN"].cost == steep and flat.cost == (0.0, 1.0)
    assert dims["SEQLEN"].gears[-1] == flat.gears[-1] and dims["SEQLEN"].gears > flat.gears
    static = simulate(trace, dims, PolicyConfig(), adaptive=False).dims["SEQLEN"]
    values = trace.dims["SEQLEN"]
    gears = np.array(dims["SEQLEN"].gears)
    padded = gears[np.searchsorted(gears, values)].astype(float)
    direct = (padded + 0.01 * padded**2).sum() / (values + 0.01 * values.astype(float) ** 2).sum()
    assert static.cost_overhead == pytest.approx(direct - 1)


@pytest.mark.parametrize(
    ("policy", "kwargs", "message"),
    [
        ("static", {"gears": {"SEQ": (1,)}}, "gears: unknown dim SEQ .the trace has SEQLEN"),
        ("optimal", {"k": {"X": 2}}, "k: unknown dim X"),
        ("adaptive", {"splittable": {"X": True}}, "splittable: unknown dim X"),
        ("pow2", {"gears": {"SEQLEN": (1,)}}, "gears: not used by policy pow2"),
        ("adaptive", {"k": {"SEQLEN": 2}}, "k: only used by policy optimal"),
        ("best", {}, "unknown policy 'best'"),
    ],
)
def test_policy_dims_misuse(policy: str, kwargs: dict, message: str) -> None:
    with pytest.raises(ShapeError, match=message):
        policy_dims(make_trace([0], SEQLEN=[5]), policy, **kwargs)


def test_static_padding_matches_direct_computation() -> None:
    rng = np.random.default_rng(3)
    n = 5000
    trace = make_trace(
        np.sort(rng.random(n) * 900).tolist(),
        BATCHSIZE=rng.integers(1, 100, n).tolist(),
        SEQLEN=rng.integers(1, 3000, n).tolist(),
    )
    dims = {
        "BATCHSIZE": Dim(gears=(4, 16, 32), max=128, splittable=True),
        "SEQLEN": Dim(gears=(256, 1024, 2048), max=4096),
    }
    result = simulate(trace, dims, PolicyConfig(), adaptive=False)
    assert result.events == n and result.updates == 0 and not result.changes
    for name, dim in dims.items():
        values = trace.dims[name].tolist()
        chunks = [chunks_for(dim.gears, v, dim.splittable) for v in values]
        padded = sum(sum(c) if c else v for c, v in zip(chunks, values, strict=True))
        over = sum(v > dim.gears[-1] for v in values)
        d = result.dims[name]
        assert d.raw_work == sum(values) and d.padded_work == padded
        assert d.padding_overhead == pytest.approx(padded / sum(values) - 1)
        assert (d.split_events, d.eager_events) == ((over, 0) if dim.splittable else (0, over))
        assert d.mean_gears == 3 and d.final_gears == dim.gears and d.adds == d.evictions == 0


def test_pow2_on_a_shipped_trace() -> None:
    trace = load_trace("azure_conv_batched")
    result = simulate(trace, policy_dims(trace, "pow2"), PolicyConfig(), adaptive=False)
    seq = trace.dims["SEQLEN"]
    top = int(seq.max())
    padded = np.minimum(1 << np.ceil(np.log2(seq)).astype(int), top).sum()
    assert result.dims["SEQLEN"].padded_work == padded
    assert result.dims["SEQLEN"].eager_events == 0
    assert result.summary()["dims"]["SEQLEN"]["mean_gears"] == pytest.approx(15)


def test_segments_follow_the_check_interval() -> None:
    trace = make_trace([0, 59.9, 60, 119, 120, 150.5], SEQLEN=[1, 2, 4, 8, 16, 32])
    config = PolicyConfig(check_interval_seconds=60.0)
    result = simulate(trace, {"SEQLEN": Dim(gears=(64,))}, config, adaptive=False)
    assert result.starts.tolist() == [0, 60, 120]
    assert result.dims["SEQLEN"].segment_raw.tolist() == [3, 12, 48]
    assert result.dims["SEQLEN"].segment_padded.tolist() == [128, 128, 128]
    assert result.duration == 150.5


def steady(seconds: int, value: int, mem: list[float] | None = None) -> Trace:
    """One event per second of `value`, with an optional memory reading per event."""
    t = np.arange(seconds, dtype=float)
    return Trace(
        "steady", t, {"SEQLEN": np.full(seconds, value)}, None if mem is None else np.array(mem)
    )


def test_adaptive_gears_apply_from_the_update_on() -> None:
    trace = steady(600, 600)  # pads 0.41 on 1024: a pad-driven addition at 600, at t=300
    result = simulate(trace, {"SEQLEN": Dim(gears=(1024,), max=1024)}, SEED)
    d = result.dims["SEQLEN"]
    assert result.updates == 1 and (d.adds, d.evictions) == (1, 0)
    assert [(c.t, c.trigger, c.action, c.gear) for c in result.changes] == [
        (300.0, "interval", "add", 600)
    ]
    assert "pad-driven" in result.changes[0].reason
    assert d.final_gears == (600, 1024)
    assert d.padded_work == 300 * 1024 + 300 * 600
    assert d.mean_gears == pytest.approx((300 * 1 + 299 * 2) / 599)
    churn = result.summary()["dims"]["SEQLEN"]["churn_per_hour"]
    assert churn == pytest.approx(3600 / 599)


def test_virtual_time_starts_at_the_first_event() -> None:
    shifted = steady(600, 600)
    shifted = Trace("late", shifted.t + 0.1, shifted.dims)
    result = simulate(shifted, {"SEQLEN": Dim(gears=(1024,), max=1024)}, SEED)
    assert [c.t for c in result.changes] == [300.0] and result.starts[1] == 60.0


@pytest.mark.parametrize(("high_at", "updates"), [(59, 1), (60, 0)])
def test_memory_reading_before_the_check_triggers_early(high_at: int, updates: int) -> None:
    mem = [0.95 if s == high_at else 0.5 for s in range(200)]
    result = simulate(
        steady(200, 600, mem), {"SEQLEN": Dim(gears=(1024,), max=1024)}, SEED
    )
    assert result.updates == updates
    assert result.dims["SEQLEN"].adds == 0  # under pressure an addition must replace an eviction


def test_adaptive_on_a_shipped_trace_is_deterministic() -> None:
    trace = load_trace("azure_code_decode")
    dims = policy_dims(trace, "adaptive")
    first, second = (simulate(trace, dims, SEED) for _ in range(2))
    assert first.summary() == second.summary()
    assert first.updates == int(trace.duration // 300)
    d = first.dims["BATCHSIZE"]
    assert d.adds == sum(c.action == "add" for c in first.changes)
    assert len(d.gears) == first.starts.size and d.raw_work == trace.dims["BATCHSIZE"].sum()


def test_a_trace_too_long_for_its_checks_is_refused_by_name() -> None:
    trace = Trace("endless", np.array([0.0, 1e300]), {"B": np.array([1, 2])})
    with pytest.raises(TraceError, match="endless"):
        simulate(trace, policy_dims(trace, "adaptive"), PolicyConfig())
