"""Measured costs: bounded measurements, the fits (Line, Curve, isotonic), and Prices."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gearshift.core.costs import (
    MAX_GRAPH_BYTES,
    MAX_MEASURED_SECONDS,
    MAX_POINTS,
    MIN_GEARS,
    Curve,
    DimCosts,
    Line,
    Measurement,
    Prices,
    buffer_bytes,
    buffer_line,
    fit,
    isotonic,
    prices_for,
    spent,
)
from gearshift.core.dims import MAX_VALUE, Dim
from gearshift.core.gears import DimGears
from gearshift.errors import ShapeError

GOOD = {"gear": 64, "capture_seconds": 0.2, "graph_bytes": 1 << 20, "replay_seconds": 1e-3}


def m(gear: int, capture: float = 0.1, nbytes: int = 1000, replay: float = 1e-3) -> Measurement:
    return Measurement(gear, capture, nbytes, replay)


def test_a_measurement_keeps_its_figures_as_python_numbers() -> None:
    got = Measurement(np.int64(64), np.float32(0.25), np.int64(4096), 1)
    assert (got.gear, got.capture_seconds, got.graph_bytes, got.replay_seconds) == (
        64, 0.25, 4096, 1.0)
    assert type(got.gear) is int and type(got.graph_bytes) is int
    assert type(got.replay_seconds) is float


@pytest.mark.parametrize(("key", "value"), [
    ("gear", 0), ("gear", -3), ("gear", MAX_VALUE + 1), ("gear", True), ("gear", 2.0),
    ("gear", "8"),
    ("capture_seconds", float("nan")), ("capture_seconds", float("inf")),
    ("capture_seconds", -1e-9), ("capture_seconds", True),
    ("capture_seconds", MAX_MEASURED_SECONDS * 1.001), ("capture_seconds", "0.1"),
    ("replay_seconds", float("nan")), ("replay_seconds", -float("inf")),
    ("replay_seconds", -0.5), ("replay_seconds", False), ("replay_seconds", 1e9),
    ("graph_bytes", -1), ("graph_bytes", MAX_GRAPH_BYTES + 1), ("graph_bytes", True),
    ("graph_bytes", float("nan")), ("graph_bytes", None),
])
def test_a_measurement_out_of_bounds_is_refused_naming_the_field(key: str, value: object) -> None:
    with pytest.raises(ShapeError, match=f"measurement {key} must be"):
        Measurement(**{**GOOD, key: value})


def test_the_bounds_themselves_are_accepted() -> None:
    top = Measurement(MAX_VALUE, MAX_MEASURED_SECONDS, MAX_GRAPH_BYTES, 0.0)
    assert top.graph_bytes == MAX_GRAPH_BYTES and top.capture_seconds == MAX_MEASURED_SECONDS
    assert Measurement(1, 0.0, 0, 0.0).gear == 1


def test_line_fit_is_exact_on_a_line() -> None:
    x = np.array([8, 64, 512, 4096])
    line = Line.fit(x, 0.05 + 2e-4 * x)
    assert (line.a, line.b) == (pytest.approx(0.05), pytest.approx(2e-4))
    assert line(np.array([1000]))[0] == pytest.approx(0.05 + 0.2)


def test_line_fit_of_one_x_or_none_is_a_constant() -> None:
    assert Line.fit(np.array([64, 64, 64]), np.array([1.0, 2.0, 6.0])) == Line(3.0, 0.0)
    assert Line.fit(np.array([], np.int64), np.array([])) == Line(0.0, 0.0)


def test_line_fit_never_falls_with_the_gear() -> None:
    x = np.array([10, 20, 30])
    assert Line.fit(x, np.array([3.0, 2.0, 1.0])) == Line(2.0, 0.0)  # the mean, flat
    steep = Line.fit(x, np.array([0.0, 5.0, 10.0]))  # y = -5 + 0.5 x: the intercept clipped
    assert (steep.a, steep.b) == (0.0, pytest.approx(0.5))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 10_000), st.floats(0, 100)), min_size=1, max_size=12))
def test_a_fitted_line_is_never_negative(points: list[tuple[int, float]]) -> None:
    x = np.array([p[0] for p in points])
    line = Line.fit(x, np.array([p[1] for p in points]))
    assert line.a >= 0 and line.b >= 0
    assert (line(np.array([1, 10, 10_000, 10**9])) >= 0).all()


def test_curve_runs_through_its_points_and_extrapolates_linearly_at_both_ends() -> None:
    curve = Curve((10, 20, 40), (1.0, 3.0, 4.0))
    x = np.array([10, 15, 20, 30, 40, 60, 5, 0])
    # inside: the points and straight lines between; above: the last slope (0.05 per unit);
    # below: the first (0.2 per unit), never under 0
    assert curve(x).tolist() == pytest.approx([1.0, 2.0, 3.0, 3.5, 4.0, 5.0, 0.0, 0.0])
    assert float(curve(8)) == pytest.approx(0.6)


def test_a_curve_of_one_point_is_flat() -> None:
    assert Curve((64,), (0.5,))(np.array([1, 64, 10**6])).tolist() == [0.5, 0.5, 0.5]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.floats(0, 10), st.integers(1, 5)),
                min_size=2, max_size=10, unique_by=lambda p: p[0]))
def test_a_fitted_curve_is_monotone_and_never_negative(
        points: list[tuple[int, float, int]]) -> None:
    ms = [m(g, replay=s) for g, s, n in points for _ in range(n)]
    curve = fit(ms).replay
    assert curve is not None and curve.gears == tuple(sorted(p[0] for p in points))
    x = np.arange(1, 12_000, 7)
    y = curve(x)
    assert (y >= 0).all() and (np.diff(y) >= -1e-12).all()


def _isotonic_reference(y: list[float], w: list[float]) -> list[float]:
    """The closed form of weighted isotonic regression: the max over j <= i of the min over
    k >= i of the weighted mean of y[j..k]."""
    n = len(y)

    def mean(j: int, k: int) -> float:
        return sum(a * b for a, b in zip(y[j:k + 1], w[j:k + 1], strict=True)) / sum(w[j:k + 1])

    return [max(min(mean(j, k) for k in range(i, n)) for j in range(i + 1)) for i in range(n)]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.floats(-100, 100), st.integers(1, 9)), min_size=1, max_size=9))
def test_isotonic_matches_the_brute_force_reference(pairs: list[tuple[float, int]]) -> None:
    y, w = [p[0] for p in pairs], [float(p[1]) for p in pairs]
    got = isotonic(np.array(y), np.array(w))
    assert got.shape == (len(y),) and (np.diff(got) >= -1e-9).all()
    assert got.tolist() == pytest.approx(_isotonic_reference(y, w), abs=1e-9)


def test_isotonic_pools_a_violation_into_its_weighted_mean() -> None:
    got = isotonic(np.array([1.0, 5.0, 2.0, 6.0]), np.array([1.0, 1.0, 3.0, 1.0]))
    assert got.tolist() == pytest.approx([1.0, 2.75, 2.75, 6.0])


def test_fit_of_nothing_costs_nothing_and_has_no_curve() -> None:
    assert fit([]) == DimCosts(None, None, Line(), 0)
    assert fit(iter([])).measurements == 0


def test_fit_of_one_gear_has_constant_captures_and_bytes_and_no_replay_curve_yet() -> None:
    costs = fit([m(64, 0.2, 1000, 1e-3), m(64, 0.4, 3000, 2e-3), m(64, 0.9, 2000, 9e-3)])
    assert MIN_GEARS == 2 and costs.replay is None and costs.measurements == 3
    assert costs.capture == Curve((64,), (0.4,)) and costs.bytes == Line(2000.0, 0.0)  # medians
    assert costs.capture(np.array([1, 64, 8192])).tolist() == [0.4, 0.4, 0.4]


def test_fit_of_many_gears_reads_per_gear_medians_in_any_order() -> None:
    ms = [m(64, 0.1 + 1e-3 * 64, 1000 + 10 * 64, 1e-3), m(256, 0.1 + 1e-3 * 256, 1000 + 10 * 256,
                                                        4e-3),
          m(1024, 0.1 + 1e-3 * 1024, 1000 + 10 * 1024, 3e-3),  # a replay lower than 256's:
          m(1024, 9.0, 10**9, 3e-3), m(1024, 0.1 + 1e-3 * 1024, 1000 + 10 * 1024, 3e-3),
          m(4096, 0.1 + 1e-3 * 4096, 1000 + 10 * 4096, 1.6e-2)]
    costs = fit(ms)
    assert costs == fit(reversed(ms)) and costs.measurements == 6
    assert costs.replay is not None and costs.replay.gears == (64, 256, 1024, 4096)
    # 256 (4 ms, one) and 1024 (3 ms, three) pool into their weighted mean 3.25 ms
    assert costs.replay.seconds == pytest.approx((1e-3, 3.25e-3, 3.25e-3, 1.6e-2))
    # capture seconds: the per-gear medians (1024's outlier of 9 s is outvoted), monotone
    assert costs.capture is not None and costs.capture.gears == costs.replay.gears
    assert costs.capture.seconds == pytest.approx([0.1 + 1e-3 * g for g in (64, 256, 1024, 4096)])
    assert (costs.bytes.a, costs.bytes.b) == (pytest.approx(1000), pytest.approx(10))
    summary = costs.summary()
    assert summary["replay_seconds"] == dict(zip(costs.replay.gears, costs.replay.seconds,
                                                 strict=True))
    assert summary["capture_seconds"] == dict(zip(costs.capture.gears, costs.capture.seconds,
                                                  strict=True))
    assert summary["measurements"] == 6


def test_a_convex_capture_cost_is_fitted_as_measured_not_as_a_line_through_it() -> None:
    # on the cpu a capture runs the model, so it grows like the work: quadratic here; a
    # straight line through these points would put gear 1024 at several times its cost
    gears = (64, 256, 1024, 4096, 16384)
    costs = fit([m(g, 1e-9 * g * g, 1000, 1e-9 * g * g) for g in gears])
    assert costs.capture is not None
    assert float(costs.capture(1024)) == pytest.approx(1e-9 * 1024**2)
    line = Line.fit(np.array(gears), np.array([1e-9 * g * g for g in gears]))
    assert float(line(1024)) > 5 * float(costs.capture(1024))
    # a capture cost that falls with the gear is noise: pooled flat
    flat = fit([m(64, 0.3, 1, 1e-3), m(128, 0.1, 1, 2e-3)])
    assert flat.capture is not None and flat.capture.seconds == pytest.approx((0.2, 0.2))


def test_prices_capture_cost_and_held_bytes_count_every_worker() -> None:
    p = Prices(Line(1.0, 0.01), workers=3, bytes=Line(100.0, 2.0))
    assert p.capture_cost([100, 200]) == pytest.approx(((1 + 1) + (1 + 2)) * 3)
    assert p.capture_cost(np.array([100])) == pytest.approx(6.0)
    assert p.capture_cost([]) == p.capture_cost(np.array([], np.int64)) == 0.0
    assert p.held_bytes([10, 50]) == pytest.approx((120 + 200) * 3)
    assert p.held_bytes([]) == 0.0


def test_prices_work_is_the_measured_curve_else_the_dims_cost() -> None:
    dim = Dim(max=1000, cost=(1.0, 2.0))
    curve = Curve((10, 100), (1.0, 2.0))
    assert Prices(Line()).work(dim)(np.array([10]))[0] == 21.0
    assert Prices(Line(), replay=curve).work(dim)(np.array([10]))[0] == 1.0


def test_prices_for_skips_dims_without_a_curve() -> None:
    costs = {"S": fit([m(64, 0.1, 10, 1e-3), m(128, 0.2, 20, 2e-3)]),
             "B": fit([m(8, 0.1, 10, 1e-3)]), "E": fit([])}
    prices = prices_for(costs, workers=4, headroom=5e6)
    assert set(prices) == {"S"}
    p = prices["S"]
    assert (p.workers, p.headroom, p.replay) == (4, 5e6, costs["S"].replay)
    assert (p.capture, p.bytes) == (costs["S"].capture, costs["S"].bytes)
    assert prices_for(costs, workers=0)["S"].workers == 1  # at least the one that measured
    assert prices_for(costs, 2)["S"].headroom is None


def test_fit_keeps_the_largest_max_points_gears() -> None:
    ms = [m(g, replay=1e-6 * g) for g in range(1, MAX_POINTS + 11)]
    costs = fit(ms)
    assert costs.replay is not None and len(costs.replay.gears) == MAX_POINTS
    assert costs.replay.gears[0] == 11 and costs.measurements == MAX_POINTS + 10


def test_a_buffers_report_is_a_line_in_the_dims_largest_gear() -> None:
    assert buffer_line(1024, 3 * 1024 + 100, 3 * 1024) == Line(100.0, 3.0)
    assert buffer_line(1, 0, 0) == Line()


@pytest.mark.parametrize(("cap", "total", "scaling"), [
    (0, 10, 5), (MAX_VALUE + 1, 10, 5), (8, -1, 0), (8, MAX_GRAPH_BYTES + 1, 0), (8, 10, 11),
    (8, 10, -1), (8.0, 10, 5), (True, 10, 5), (8, 10.5, 5), (8, None, 0),
])
def test_a_hostile_buffers_report_is_refused(cap: object, total: object, scaling: object) -> None:
    with pytest.raises(ShapeError, match="buffers"):
        buffer_line(cap, total, scaling)  # type: ignore[arg-type]


def test_the_buffers_count_once_per_profile_at_its_largest_gears_and_bounded() -> None:
    p = {"S": Prices(Line(), workers=3, buffers=Line(10.0, 2.0)),
         "B": Prices(Line(), workers=3, buffers=Line(0.0, 100.0)), "C": Prices(Line(), 3)}
    assert buffer_bytes(p, {"S": 5, "B": 0, "C": 7}) == 3 * 20.0  # the larger line, once
    assert buffer_bytes(p, {"S": 5, "B": 1}) == 3 * 100.0
    assert buffer_bytes({"C": p["C"]}, {"C": 7}) == 0.0  # unreported
    assert p["S"].buffer_growth(5, 10) == 3 * 10.0 and p["S"].buffer_growth(5, 5) == 0.0
    huge = Prices(Line(), buffers=Line(0.0, float(MAX_GRAPH_BYTES)))
    assert huge.buffer_bytes(MAX_VALUE) == MAX_GRAPH_BYTES  # a worker's figure, bounded


def test_spent_counts_what_the_buffers_grow_by() -> None:
    p = {"S": Prices(Line(), workers=2, bytes=Line(1.0), buffers=Line(0.0, 1.0))}
    before, after = {"S": DimGears((8, 16), {})}, {"S": DimGears((8, 16, 32), {})}
    assert spent(p, before, after) == 2 * 1.0 + 2 * 16.0
