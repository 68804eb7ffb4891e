"""Trace replay: gear sets per policy, padded work against a direct computation, cadence."""

from __future__ import annotations

import numpy as np
import pytest

from gearshift.config import PolicyConfig
from gearshift.dims import Dim, chunks_for
from gearshift.errors import ShapeError
from gearshift.optimal import optimal_gears
from gearshift.simulate import policy_dims, simulate
from gearshift.trace import Trace, load_trace


def make_trace(t: list[float], **dims: list[int]) -> Trace:
    return Trace("synthetic", np.array(t, float), {k: np.array(v) for k, v in dims.items()})


def test_default_dims_cover_the_trace_with_powers_of_two() -> None:
    trace = make_trace([0, 1, 2], BATCHSIZE=[3, 56, 1], SEQLEN=[9000, 2, 14050])
    dims = policy_dims(trace, "adaptive")
    assert dims["BATCHSIZE"] == Dim(gears=(1, 2, 4, 8, 16, 32, 64), max=64, splittable=True)
    assert dims["SEQLEN"].gears[-1] == dims["SEQLEN"].max == 16384
    assert not dims["SEQLEN"].splittable
    assert policy_dims(trace, "pow2") == policy_dims(trace, "static") == dims


def test_given_gears_and_splittable_override() -> None:
    trace = make_trace([0, 1], SEQLEN=[100, 3000])
    dims = policy_dims(trace, "static", gears={"SEQLEN": (512, 8192)}, splittable={"SEQLEN": True})
    assert dims["SEQLEN"] == Dim(gears=(512, 8192), max=8192, splittable=True)
    assert policy_dims(trace, "static", gears={"SEQLEN": (64,)})["SEQLEN"].max == 4096


def test_optimal_dims_use_k_or_the_ladder_count() -> None:
    trace = load_trace("azure_code_batched")
    dims = policy_dims(trace, "optimal", k={"SEQLEN": 5})
    assert dims["SEQLEN"].gears == optimal_gears(trace.dims["SEQLEN"], 5)
    assert dims["BATCHSIZE"].gears == optimal_gears(trace.dims["BATCHSIZE"], 6)  # 1..32


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
    padded = (1 << np.ceil(np.log2(seq)).astype(int)).sum()
    assert result.dims["SEQLEN"].padded_work == padded
    assert result.dims["SEQLEN"].eager_events == 0
    assert result.summary()["dims"]["SEQLEN"]["mean_gears"] == pytest.approx(15)


def test_segments_follow_the_check_interval() -> None:
    trace = make_trace([0, 59.9, 60, 119, 120, 150.5], SEQLEN=[1, 2, 4, 8, 16, 32])
    result = simulate(trace, {"SEQLEN": Dim(gears=(64,))}, PolicyConfig(), adaptive=False)
    assert result.starts.tolist() == [0, 60, 120]
    assert result.dims["SEQLEN"].segment_raw.tolist() == [3, 12, 48]
    assert result.dims["SEQLEN"].segment_padded.tolist() == [128, 128, 128]
    assert result.duration == 150.5
