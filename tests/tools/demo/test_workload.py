"""The demo's workload: rows and their times, useful and padded tokens and pairs, the cost
model (the stride of a run: test_mix)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gearshift.core.dims import Dim, ladder
from gearshift.tools.demo.workload import (
    DEFAULT_TRACE,
    Cost,
    Workload,
    load_workload,
    padded_pairs,
    padded_tokens,
    useful_tokens,
)
from gearshift.tools.trace import shipped_traces

DIMS = {"BATCHSIZE": Dim(max=8, splittable=True), "SEQLEN": Dim(max=16)}
SIZES = {"BATCHSIZE": np.array([1, 3, 8, 5, 2]), "SEQLEN": np.array([16, 5, 9, 1, 3])}
TIMES = np.array([0.0, 1.0, 2.5, 4.0, 9.0])


def workload() -> Workload:
    return Workload("t", DIMS, SIZES, TIMES, duration=10.0, rows=5)


def test_default_trace_is_shipped_and_dims_are_the_simulators() -> None:
    assert DEFAULT_TRACE in shipped_traces()
    w = load_workload("azure_conv_batched")
    assert (w.events, w.rows, w.stride) == (12_172, 12_172, 1)
    assert list(w.dims) == ["BATCHSIZE", "SEQLEN"]
    assert w.dims["SEQLEN"].initial_gears == ladder(1, 14_050)  # 1, 2, 4, ..., 8192, 14050
    assert w.dims["BATCHSIZE"].splittable and not w.dims["SEQLEN"].splittable
    assert len(w.times) == w.events and w.times[0] == 0.0 and np.all(np.diff(w.times) >= 0)


def test_seqlen_the_sequence_axis_comes_last(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("t,SEQLEN,BATCHSIZE\n0.0,7,2\n1.0,3,1\n")
    w = load_workload(str(path))
    assert list(w.dims) == list(w.sizes) == ["BATCHSIZE", "SEQLEN"]
    assert w.sizes["SEQLEN"].tolist() == [7, 3]


def test_tokens_are_products_over_dims_of_raw_and_of_padded_work() -> None:
    assert useful_tokens(SIZES).tolist() == [16, 15, 72, 5, 6]
    # gears: B 1,2,4,8 and S 1,2,4,8,16: B 3 -> 4, S 5 -> 8, S 9 -> 16
    assert padded_tokens(DIMS, SIZES).tolist() == [16, 32, 128, 8, 8]
    gears = {"BATCHSIZE": (2, 8), "SEQLEN": (16,)}
    assert padded_tokens(DIMS, SIZES, gears).tolist() == [32, 128, 128, 128, 32]
    split = {"BATCHSIZE": (2,), "SEQLEN": (16,)}  # B 3 = 2 + 2: two chunks of 2
    assert padded_tokens(DIMS, SIZES, split).tolist() == [32, 64, 128, 96, 32]


def test_pairs_are_padded_tokens_times_the_padded_sequence() -> None:
    assert padded_pairs(DIMS, SIZES).tolist() == [16 * 16, 32 * 8, 128 * 16, 8 * 1, 8 * 4]
    gears = {"BATCHSIZE": (2, 8), "SEQLEN": (16,)}
    assert padded_pairs(DIMS, SIZES, gears).tolist() == [
        32 * 16,
        128 * 16,
        128 * 16,
        128 * 16,
        32 * 16,
    ]
    batch = {"BATCHSIZE": DIMS["BATCHSIZE"]}  # no SEQLEN: rows of single tokens
    assert padded_pairs(batch, SIZES).tolist() == [1, 4, 8, 8, 2]


def test_every_keeps_one_row_in_stride_and_its_time() -> None:
    w = workload().every(2)
    assert w.stride == 2 and w.rows == 5 and w.events == 3
    assert w.sizes["SEQLEN"].tolist() == [16, 9, 3] and w.times.tolist() == [0.0, 2.5, 9.0]
    w = workload().every(1.5)  # rows 0, 1 (1.5), 3, 4 (4.5)
    assert w.stride == 1.5 and w.events == 4
    assert w.sizes["SEQLEN"].tolist() == [16, 5, 1, 3] and w.times.tolist() == [0, 1, 4, 9]


def test_cost_fit_recovers_a_call_token_pair_model() -> None:
    truth = Cost(per_call=2e-4, per_token=5e-6, per_pair=2e-9)
    samples = [(s, s * s, truth.seconds(1, s, s * s)) for s in (1, 16, 256, 1024, 4096, 16384)]
    fitted = Cost.fit(samples)
    for got, want in zip(
        (fitted.per_call, fitted.per_token, fitted.per_pair),
        (truth.per_call, truth.per_token, truth.per_pair),
        strict=True,
    ):
        assert got == pytest.approx(want, rel=1e-6)


def test_priced_dims_give_seqlen_the_models_cost() -> None:
    dims = {"BATCHSIZE": Dim(max=64, splittable=True), "SEQLEN": Dim(max=4096)}
    priced = Cost(-1e-4, 2e-6, 1e-9).priced(dims)
    assert priced["SEQLEN"].cost == (0.0, 2e-6, 1e-9)  # a negative fit is no cost
    assert priced["BATCHSIZE"] == dims["BATCHSIZE"]
    assert priced["SEQLEN"].work(np.array([1000])) == pytest.approx(3e-3)
    assert Cost(1e-4, 0.0, -1e-9).priced(dims) == dims  # nothing rising: elements, as before
    assert Cost(1e-4, 2e-6, 1e-9).priced({"BATCHSIZE": dims["BATCHSIZE"]}) == {
        "BATCHSIZE": dims["BATCHSIZE"]}

