"""Trace replay: gear sets per policy, padded work against a direct computation, cadence."""

from __future__ import annotations

import numpy as np
import pytest

from gearshift.core.config import PolicyConfig
from gearshift.core.costs import Line, Prices
from gearshift.core.dims import Dim, chunks_for, ladder
from gearshift.core.memory import MODEL_GRAPH_BYTES
from gearshift.core.optimal import optimal_gears
from gearshift.errors import ShapeError, TraceError
from gearshift.tools.bench.priced import device_costs
from gearshift.tools.simulate import PROFILE, Device, policy_dims, simulate
from gearshift.tools.trace import Trace, load_trace

SEED = PolicyConfig(policy_mode="rules")  # the replay mechanics, checked against the original rules


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


# The device: what captures cost, counted once per worker


def slice_of(name: str, minutes: float) -> Trace:
    """The first `minutes` of a shipped trace."""
    trace = load_trace(name)
    n = int(np.searchsorted(trace.t, trace.t[0] + 60 * minutes))
    return Trace(name, trace.t[:n], {k: v[:n] for k, v in trace.dims.items()})


def test_a_static_set_captures_each_gear_once_per_worker() -> None:
    trace = make_trace([0, 1, 2, 3], SEQLEN=[100, 300, 300, 900])
    dims = {"SEQLEN": Dim(gears=(64, 128, 512, 1024), max=1024)}
    device = Device(Line(2.0, 0.001), workers=3)
    d = simulate(trace, dims, PolicyConfig(), adaptive=False, device=device).dims["SEQLEN"]
    seconds = 3 * sum(2.0 + 0.001 * g for g in (64, 128, 512, 1024))
    assert (d.captures, d.capture_seconds) == (4, pytest.approx(seconds))
    assert (d.padded_cost, d.raw_cost) == (128 + 512 + 512 + 1024, 1600)
    assert d.device_overhead == pytest.approx((2176 + seconds) / 1600 - 1)
    assert d.cost_overhead == pytest.approx(2176 / 1600 - 1)
    lazy = simulate(trace, dims, PolicyConfig(), adaptive=False,
                    device=Device(Line(2.0, 0.001), 3, lazy=True)).dims["SEQLEN"]
    assert (lazy.captures, lazy.capture_seconds) == (3, pytest.approx(seconds - 3 * 2.064))  # 64
    free = simulate(trace, dims, PolicyConfig(), adaptive=False).dims["SEQLEN"]
    assert (free.captures, free.capture_seconds) == (4, 0.0)
    assert free.device_overhead == pytest.approx(free.cost_overhead)


def test_lazily_a_gear_is_captured_when_an_event_runs_on_it() -> None:
    trace = make_trace([0, 1, 2], B=[37, 48, 37], S=[1000, 1000, 1000])
    dims = {"B": Dim(gears=(2, 4, 8, 16), max=64, splittable=True),  # 16,16,8 and 16,16,16
            "S": Dim(gears=(64, 256), max=2000)}  # every event over 256 runs eager
    result = simulate(trace, dims, PolicyConfig(), adaptive=False,
                      device=Device(Line(1.0, 0.5), lazy=True))
    assert (result.dims["B"].captures, result.dims["B"].capture_seconds) == (
        2, (1 + 0.5 * 8) + (1 + 0.5 * 16))  # 8 and 16; 2 and 4 never ran a request
    assert result.dims["S"].eager_events == 3
    assert (result.dims["S"].captures, result.dims["S"].capture_seconds) == (0, 0.0)


@pytest.mark.parametrize(("lazy", "captured"), [(False, (256, 1024, 600)), (True, (1024, 600))])
def test_the_adaptive_policy_captures_its_start_and_every_gear_it_adds(
        lazy: bool, captured: tuple[int, ...]) -> None:
    device = Device(Line(1.0, 0.01), workers=2, lazy=lazy)
    result = simulate(steady(600, 600), {"SEQLEN": Dim(gears=(256, 1024), max=1024)},
                      PolicyConfig(), device=device)
    d = result.dims["SEQLEN"]
    assert [(c.action, c.gear) for c in result.changes] == [("evict", 256), ("add", 600)]
    assert d.captures == len(captured)  # 256 never ran a request: lazily, never captured
    assert d.capture_seconds == pytest.approx(2 * sum(1.0 + 0.01 * g for g in captured))


def test_an_unpriced_device_only_counts_and_a_priced_one_tells_the_policy() -> None:
    dims = {"SEQLEN": Dim(gears=(1024,), max=1024)}
    assert Device(Line(5.0), 4).prices(dims) is None
    assert Device(Line(5.0), 4, priced=True).prices(dims) == {
        PROFILE: {"SEQLEN": Prices(Line(5.0), 4, bytes=Line(float(MODEL_GRAPH_BYTES)))}}
    trace = slice_of("azure_code_prefill", 5)
    dims = policy_dims(trace, "adaptive")
    plain = simulate(trace, dims, PolicyConfig())
    counted = simulate(trace, dims, PolicyConfig(), device=Device(Line(5.0), 2))
    assert counted.changes == plain.changes
    d = counted.dims["SEQLEN"]
    assert d.capture_seconds == pytest.approx(5.0 * 2 * d.captures) and d.captures > 0


def test_pricing_a_dear_capture_lowers_churn_and_device_time() -> None:
    trace = slice_of("azure_code_prefill", 10)
    dims = policy_dims(trace, "adaptive", cost=device_costs(trace))  # in device seconds
    unpriced, priced = (simulate(trace, dims, PolicyConfig(),
                                 device=Device(Line(5.0), 1, priced=p, lazy=True)).dims["SEQLEN"]
                        for p in (False, True))
    assert priced.adds + priced.evictions < (unpriced.adds + unpriced.evictions) / 2
    assert priced.captures < unpriced.captures
    assert priced.device_overhead < unpriced.device_overhead
    # the static ladder pays its captures once, and never changes
    pow2 = simulate(trace, policy_dims(trace, "pow2", cost=device_costs(trace)), PolicyConfig(),
                    adaptive=False, device=Device(Line(5.0))).dims["SEQLEN"]
    assert (pow2.adds, pow2.evictions) == (0, 0)
    assert (pow2.captures, pow2.capture_seconds) == (len(pow2.final_gears),
                                                     5.0 * len(pow2.final_gears))


def test_graph_bytes_are_held_per_segment_on_every_worker() -> None:
    trace = make_trace([0, 1, 2, 3], SEQLEN=[100, 300, 300, 900])
    dims = {"SEQLEN": Dim(gears=(64, 128, 512, 1024), max=1024)}
    device = Device(workers=3, bytes={"SEQLEN": Line(10.0, 1.0)})
    r = simulate(trace, dims, PolicyConfig(), adaptive=False, device=device)
    held = 3 * sum(10.0 + g for g in (64, 128, 512, 1024))
    assert (r.dims["SEQLEN"].peak_bytes, r.dims["SEQLEN"].mean_bytes) == (held, held)
    assert (r.peak_bytes, r.mean_bytes, r.budget) == (held, held, None)
    lazy = simulate(trace, dims, PolicyConfig(), adaptive=False,
                    device=Device(workers=3, lazy=True, bytes={"SEQLEN": Line(10.0, 1.0)}))
    assert lazy.peak_bytes == held - 3 * 74  # 64 never ran a request: never captured
    model = simulate(trace, dims, PolicyConfig(), adaptive=False)
    assert model.peak_bytes == 4 * MODEL_GRAPH_BYTES  # unmeasured: the model's bytes a graph


def test_the_default_bound_holds_priced_graphs_to_the_start_up_bytes_plus_the_slack() -> None:
    trace = slice_of("azure_code_prefill", 10)
    dims = policy_dims(trace, "adaptive", cost=device_costs(trace))
    bytes_ = {"SEQLEN": Line(2e6, 8e4)}
    runs = {ratio: simulate(trace, dims, PolicyConfig(graph_memory_budget_ratio=ratio),
                            device=Device(Line(0.05), priced=True, bytes=bytes_))
            for ratio in (1.25, 0.8, None)}
    start = float(Line(2e6, 8e4)(np.array(dims["SEQLEN"].initial_gears, float)).sum())
    assert runs[1.25].budget == pytest.approx(1.25 * start) and runs[None].budget is None
    low = runs[0.8]  # under the start-up bytes: pressure evicts down to it
    assert low.dims["SEQLEN"].segment_bytes[-1] <= low.budget < runs[1.25].budget
    assert runs[1.25].peak_bytes <= runs[1.25].budget < runs[None].peak_bytes


def test_modelled_buffers_count_once_at_the_largest_gear_and_leave_more_room() -> None:
    trace = slice_of("azure_code_prefill", 10)
    dims = policy_dims(trace, "adaptive", cost=device_costs(trace))
    per_token = {"SEQLEN": Line(0.0, 8e4)}
    runs = [simulate(trace, dims, PolicyConfig(),
                     device=Device(Line(0.05), 2, priced=True, bytes=per_token, buffers=b))
            for b in (None, per_token)]
    plain, buffered = runs
    top = dims["SEQLEN"].initial_gears[-1]
    start = 2 * 8e4 * sum(dims["SEQLEN"].initial_gears)
    assert plain.budget == pytest.approx(1.25 * start) and plain.segment_buffers is None
    assert buffered.budget == pytest.approx(1.25 * (start + 2 * 8e4 * top))
    tops = np.array([g[-1] for g in buffered.dims["SEQLEN"].gears], float)
    assert buffered.segment_buffers == pytest.approx(2 * 8e4 * tops)
    assert buffered.peak_bytes <= buffered.budget
    graphs = buffered.dims["SEQLEN"].mean_bytes  # the quarter of the buffers: more graphs
    assert graphs > plain.dims["SEQLEN"].mean_bytes
    assert "buffers" in buffered.summary()["graph_bytes"]
    assert "buffers" not in plain.summary()["graph_bytes"]


def test_the_largest_gear_only_grows_under_drift_and_memory_pressure() -> None:
    # Sizes drift down from ~8000 (under the largest gear, 16384) to ~100, then up past it;
    # memory is short for the middle third. The largest gear goes up (cover), never down.
    rng = np.random.default_rng(3)
    t = np.sort(rng.uniform(0.0, 5400.0, 5 * 5400))
    level = np.interp(t, [0, 1800, 3600, 5400], [8000, 100, 100, 20000])
    values = np.clip(rng.normal(level, level / 10), 1, 30000).astype(np.int64)
    mem = np.where((t > 1800) & (t < 3600), 0.95, 0.5)
    trace = Trace("drift", t, {"SEQLEN": values}, mem)
    dims = policy_dims(trace, "adaptive", gears={"SEQLEN": ladder(1, 16384)})
    result = simulate(trace, dims, PolicyConfig())
    tops = [g[-1] for g in result.dims["SEQLEN"].gears]
    assert tops == sorted(tops) and tops[-1] > tops[0]
    for c in result.changes:
        if c.action == "evict":
            top = tops[int(np.searchsorted(result.starts, c.t))]
            assert c.gear < top, c  # the largest of the round's new set stays
    assert any(c.action == "evict" and "memory pressure" in c.reason for c in result.changes)


def test_a_group_of_ranks_decides_as_one_device_its_steps_counted_once() -> None:
    rng = np.random.default_rng(5)
    n = 4000
    sizes = np.r_[rng.integers(1, 300, n // 2), rng.integers(500, 900, n // 2)]
    trace = make_trace(list(np.linspace(0, 600, n)), SEQLEN=list(sizes))
    dims = policy_dims(trace, "adaptive")
    device = Device(priced=True, bytes={"SEQLEN": Line(2**20)})
    alone = simulate(trace, dims, PolicyConfig(), device=device)
    group = simulate(trace, dims, PolicyConfig(), device=device, ranks=4)
    assert alone.updates > 0 and group.changes == alone.changes
    assert group.dims["SEQLEN"].final_gears == alone.dims["SEQLEN"].final_gears
