"""`gearshift bench optimal` runs, agrees with the quadratic DP, and reports its keys."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from gearshift.tools.bench.optimal import command, quadratic_cost


def test_quadratic_baseline_is_the_optimum_of_a_tiny_case() -> None:
    # {2, 3, 10} with one gear per value pads nothing; two gears: {3, 10} pads 1 on value 2.
    assert quadratic_cost(np.array([10, 2, 3]), np.ones(3), 3) == pytest.approx(15)
    assert quadratic_cost(np.array([10, 2, 3]), np.ones(3), 2) == pytest.approx(16)
    assert quadratic_cost(np.array([10, 2, 3]), np.ones(3), 1) == pytest.approx(30)


def test_bench_reports_json() -> None:
    args = ["--values", "300", "--baseline-values", "100", "--k", "5", "--runs", "2", "--json"]
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 0, result.output  # the DP found the quadratic DP's cost
    data = json.loads(result.output)
    assert (data["values"], data["baseline_values"], data["runs"]) == (300, 100, 2)
    for key in ("dp_ms", "dp_ms_at_baseline", "quadratic_ms_at_baseline", "speedup_at_baseline"):
        low, high = data[f"{key}_range"]
        assert 0 < low <= data[key] <= high, key
