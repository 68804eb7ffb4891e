"""The demo's merged workload: profiles on one timeline, their common stride, sources by name
and by path, the stride and the slices."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim
from gearshift.errors import TraceError
from gearshift.tools.demo.mix import (
    DECODE,
    PREFILL,
    Mix,
    load_mix,
    paced,
    slice_ends,
    stride_for,
)
from gearshift.tools.demo.workload import PROFILE, Cost, Workload, padded_tokens

PREFILLS = Workload("p", {"SEQLEN": Dim(max=16)}, {"SEQLEN": np.array([16, 5, 9, 3])},
                    np.array([0.0, 1.0, 2.5, 4.0]), duration=4.0, rows=4)
DECODES = Workload("d", {"BATCHSIZE": Dim(max=8, splittable=True)},
                   {"BATCHSIZE": np.array([1, 3, 8, 5, 2, 7])},
                   np.array([0.0, 0.5, 1.0, 2.5, 3.0, 6.0]), duration=6.0, rows=6)
PER_TOKEN = Cost(per_call=0.0, per_token=0.01, per_pair=0.0)


def mix() -> Mix:
    return Mix.of("src", {PREFILL: PREFILLS, DECODE: DECODES})


def rows(m: Mix) -> list[tuple[str, int]]:
    return [(m.names[p], i) for p, i in zip(m.which.tolist(), m.local.tolist(), strict=True)]


def test_rows_merge_in_time_order_each_profile_in_its_own_order() -> None:
    m = mix()
    assert m.names == [PREFILL, DECODE] and m.events == 10 and m.rows == 10
    assert np.all(np.diff(m.times) >= 0) and m.duration == 6.0
    # ties (0.0, 1.0, 2.5): the first profile's row first
    assert rows(m) == [(PREFILL, 0), (DECODE, 0), (DECODE, 1), (PREFILL, 1), (DECODE, 2),
                       (PREFILL, 2), (DECODE, 3), (DECODE, 4), (PREFILL, 3), (DECODE, 5)]
    for p, w in m.profiles.items():  # every row once, at its own time
        at = m.which == m.names.index(p)
        assert sorted(m.local[at].tolist()) == list(range(w.events))
        assert m.times[at].tolist() == w.times.tolist()


def test_every_subsamples_each_profile_by_the_same_stride() -> None:
    m = mix().every(2)
    assert m.stride == 2 and m.rows == 10 and m.events == 2 + 3
    assert m.profiles[PREFILL].sizes["SEQLEN"].tolist() == [16, 9]
    assert m.profiles[DECODE].times.tolist() == [0.0, 1.0, 3.0]
    assert rows(m) == [(PREFILL, 0), (DECODE, 0), (DECODE, 1), (PREFILL, 1), (DECODE, 2)]
    m = mix().every(1.5)  # rows floor(1.5 i) of each: prefill 0, 1, 3; decode 0, 1, 3, 4
    assert [w.events for w in m.profiles.values()] == [3, 4]
    with pytest.raises(AssertionError):
        m.every(2)


def test_a_row_costs_its_profiles_model_on_the_initial_gears() -> None:
    m = mix()
    calls = Cost(per_call=1.0, per_token=0.0, per_pair=0.0)
    seconds = m.seconds({PREFILL: PER_TOKEN, DECODE: calls})
    assert seconds[m.which == 1].tolist() == [1.0] * 6
    padded = padded_tokens(PREFILLS.dims, PREFILLS.sizes)  # 16, 8, 16, 4
    assert seconds[m.which == 0].tolist() == pytest.approx((padded * 0.01).tolist())


def test_stride_and_slices_cover_every_profile() -> None:
    m = mix()
    costs = {PREFILL: PER_TOKEN, DECODE: PER_TOKEN}
    total = float(m.seconds(costs).sum())  # 0.44 + 0.29
    assert stride_for(m, costs, budget=total, parallel=1) == 1.0
    assert stride_for(m, costs, budget=total / 4, parallel=2) == pytest.approx(2.0)
    ends = slice_ends(m, costs, 3)
    assert ends[-1] == m.events and ends == sorted(set(ends)) and len(ends) <= 3
    assert slice_ends(m, costs, 100) == list(range(1, m.events + 1))  # never an empty slice


def test_a_shipped_source_gives_both_profiles_and_a_trace_one() -> None:
    for name in ("azure_conv", "conv"):
        m = load_mix(name)
        assert m.name == "azure_conv" and m.names == [PREFILL, DECODE]
        assert m.profiles[PREFILL].trace == "azure_conv_prefill"
        assert list(m.profiles[PREFILL].dims) == ["SEQLEN"]
        assert list(m.profiles[DECODE].dims) == ["BATCHSIZE"]
        assert m.events == 19_366 + 140_348
    one = load_mix("azure_code_prefill")
    assert one.names == [PROFILE] and one.name == "azure_code_prefill" and np.all(one.which == 0)
    assert one.local.tolist() == list(range(one.events))


def test_a_source_by_path_and_errors(tmp_path: Path) -> None:
    (tmp_path / "s_prefill.csv").write_text("t,SEQLEN\n0.0,7\n2.0,3\n")
    (tmp_path / "s_decode.csv").write_text("t,BATCHSIZE\n1.0,2\n")
    m = load_mix(str(tmp_path / "s"))
    assert m.name == "s" and rows(m) == [(PREFILL, 0), (DECODE, 0), (PREFILL, 1)]
    assert load_mix(str(tmp_path / "s_decode.csv")).names == [PROFILE]
    (tmp_path / "half_prefill.csv").write_text("t,SEQLEN\n0.0,7\n")
    with pytest.raises(TraceError, match=r"trace not found.*source of both profiles: azure_code"):
        load_mix(str(tmp_path / "half"))  # no decode trace


def test_paced_windows_hold_the_full_rates_requests_and_the_payback_the_runs_own() -> None:
    policy = PolicyConfig()
    got = paced(policy, factor=200.0, stride=25.0)
    # one row in 25, 200x faster: a window of 600 s holds as many rows in 75 s of the run
    assert got.window_seconds == pytest.approx(policy.window_seconds * 25 / 200)
    assert got.update_interval_seconds == pytest.approx(policy.update_interval_seconds / 8)
    # a capture's seconds are real and savings accrue on the rows replayed: compressed only
    assert got.plan_payback_seconds == pytest.approx(policy.plan_payback_seconds / 200)
    assert paced(policy, 3.0, 1.0) == policy.scaled(3.0)  # no stride: one scaling
