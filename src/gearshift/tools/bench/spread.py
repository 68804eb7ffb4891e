"""Figures that other processes can move, measured over several runs: median and range.

A benchmark repeats each noisy figure (a time, a rate) `runs` times, each run measuring
gearshift and its baseline one after the other, and reports the figure as `KEY`, the median
over the runs, with `KEY_range`, [min, max]. A ratio is taken run by run, gearshift against
the baseline of the same run, then summarised the same way: its range is the spread of paired
comparisons, not of two independent medians. The report shows `median (min-max)`.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

RUNS = 5  # the default number of runs of a noisy figure


def summarise(out: dict[str, Any], key: str, samples: Sequence[float]) -> None:
    """`out[key]` := the median of `samples`, `out[key + "_range"]` := [min, max]."""
    assert samples, key
    out[key] = statistics.median(samples)
    out[f"{key}_range"] = [min(samples), max(samples)]


def paired(out: dict[str, Any], key: str, numerators: Sequence[float],
           denominators: Sequence[float]) -> None:
    """`summarise` the run-by-run ratios numerator / denominator (one pair per run)."""
    assert len(numerators) == len(denominators), key
    summarise(out, key, [a / b for a, b in zip(numerators, denominators, strict=True)])


def shown(result: dict[str, Any], key: str, fmt: str = ".2f") -> str:
    """`median (min-max)` of a summarised figure, or the plain figure without a range."""
    value = f"{result[key]:{fmt}}"
    span = result.get(f"{key}_range")
    return f"{value} ({span[0]:{fmt}}–{span[1]:{fmt}})" if span else value
