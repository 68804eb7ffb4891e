"""The demo's workload: rows dealt to workers, useful and padded tokens, the stride."""

from __future__ import annotations

import numpy as np

from gearshift.demo.workload import (
    DEFAULT_TRACE,
    Workload,
    load_workload,
    padded_tokens,
    stride_for,
    useful_tokens,
)
from gearshift.dims import Dim
from gearshift.trace import shipped_traces

DIMS = {"BATCHSIZE": Dim(max=8, splittable=True), "SEQLEN": Dim(max=16)}
SIZES = {"BATCHSIZE": np.array([1, 3, 8, 5, 2]), "SEQLEN": np.array([16, 5, 9, 1, 3])}


def workload() -> Workload:
    return Workload("t", DIMS, SIZES, duration=10.0, rows=5)


def test_default_trace_is_shipped_and_dims_start_on_the_power_of_two_ladder() -> None:
    assert DEFAULT_TRACE in shipped_traces()
    w = load_workload("azure_conv_batched")
    assert (w.events, w.rows, w.stride) == (12_172, 12_172, 1)
    assert w.dims["SEQLEN"].initial_gears == tuple(1 << k for k in range(15))  # max 14,050
    assert w.dims["BATCHSIZE"].splittable and not w.dims["SEQLEN"].splittable


def test_tokens_are_products_over_dims_of_raw_and_of_padded_work() -> None:
    assert useful_tokens(SIZES).tolist() == [16, 15, 72, 5, 6]
    # gears: B 1,2,4,8 and S 1,2,4,8,16: B 3 -> 4, S 5 -> 8, S 9 -> 16
    assert padded_tokens(DIMS, SIZES).tolist() == [16, 32, 128, 8, 8]
    gears = {"BATCHSIZE": (2, 8), "SEQLEN": (16,)}
    assert padded_tokens(DIMS, SIZES, gears).tolist() == [32, 128, 128, 128, 32]
    split = {"BATCHSIZE": (2,), "SEQLEN": (16,)}  # B 3 = 2 + 2: two chunks of 2
    assert padded_tokens(DIMS, SIZES, split).tolist() == [32, 64, 128, 96, 32]


def test_every_keeps_every_kth_row_and_shares_deal_them_round_robin() -> None:
    w = workload().every(2)
    assert w.stride == 2 and w.rows == 5
    assert w.sizes["SEQLEN"].tolist() == [16, 9, 3]
    shares = [w.share(i, 2) for i in range(2)]
    assert [s["SEQLEN"].tolist() for s in shares] == [[16, 3], [9]]
    assert [s["BATCHSIZE"].tolist() for s in shares] == [[1, 2], [8]]


def test_stride_is_the_smallest_that_fits_the_budget() -> None:
    w = workload()  # 192 padded tokens
    assert stride_for(w, per_token=0.01, budget=1.92) == 1
    assert stride_for(w, per_token=0.01, budget=1.0) == 2
    assert stride_for(w, per_token=0.01, budget=0.19) == 11
