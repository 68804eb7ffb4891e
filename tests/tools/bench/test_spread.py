"""`spread`: a noisy figure's median and range over runs, and ratios taken run by run."""

from __future__ import annotations

from gearshift.tools.bench.spread import paired, shown, summarise


def test_a_figure_is_its_median_with_its_range() -> None:
    out: dict = {}
    summarise(out, "x_ns", [5.0, 1.0, 3.0, 100.0])
    assert out == {"x_ns": 4.0, "x_ns_range": [1.0, 100.0]}
    assert shown(out, "x_ns", ".1f") == "4.0 (1.0–100.0)"
    assert shown({"y": 2.0}, "y") == "2.00"


def test_a_ratio_pairs_the_runs_instead_of_dividing_medians() -> None:
    out: dict = {}
    # run by run 2, 2, 2: the machine slowed both designs alike in the second run
    paired(out, "speedup", [20.0, 60.0, 30.0], [10.0, 30.0, 15.0])
    assert out == {"speedup": 2.0, "speedup_range": [2.0, 2.0]}
    paired(out, "other", [20.0, 60.0, 30.0], [30.0, 15.0, 10.0])  # medians alone: 30 / 15 = 2
    assert out["other"] == 3.0 and out["other_range"] == [20 / 30, 4.0]
