"""The plot of `gearshift simulate --plot`: gears and padding over time, a column per dim
(matplotlib, the plot extra; imported only when a figure is drawn)."""

from __future__ import annotations

import math
from typing import Any

from gearshift.tools import simulate as replay


def figure(result: replay.SimulationResult) -> Any:
    """Gears (top, log scale, ticks at the gears used: `gear_ticks`) and padding (bottom, in
    percent) over time, a column per dim; segments without requests (no padding to show)
    are shaded and labelled as such in both rows, not left as bare gaps."""
    import matplotlib
    import matplotlib.pyplot as plt
    import numpy as np

    minutes = (np.r_[result.starts, result.starts[0] + result.duration] - result.starts[0]) / 60
    fig, axes = plt.subplots(
        2, len(result.dims), figsize=(6 * len(result.dims), 7), squeeze=False, sharex=True
    )
    for col, (name, d) in enumerate(result.dims.items()):
        top, bottom = axes[0, col], axes[1, col]
        sizes = [len(g) for g in d.gears]
        top.hlines(
            np.concatenate(d.gears),
            np.repeat(minutes[:-1], sizes),
            np.repeat(minutes[1:], sizes),
            linewidth=1.5,
        )
        top.set_yscale("log", base=2)
        top.yaxis.set_major_locator(matplotlib.ticker.FixedLocator(gear_ticks(d.gears)))
        top.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(_tick))
        top.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        for k, (lo, hi) in enumerate(_runs(d.segment_raw == 0)):
            for ax in (top, bottom):
                ax.axvspan(minutes[lo], minutes[hi], color="0.9", zorder=0,
                           label=None if k else "no requests")
        top.set(ylabel="gear", title=f"{result.trace} {name}")
        with np.errstate(divide="ignore", invalid="ignore"):
            pad = d.segment_padded / d.segment_raw - 1
        bottom.stairs(pad, minutes, baseline=None)
        bottom.axhline(
            d.padding_overhead,
            linestyle="--",
            color="gray",
            label=f"overall {d.padding_overhead:.1%}",
        )
        bottom.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        bottom.set(xlabel="minutes", ylabel="padding overhead")
        bottom.legend()
    fig.tight_layout()
    return fig


def gear_ticks(gears: list[tuple[int, ...]] | tuple[tuple[int, ...], ...],
               most: int = 24) -> list[int]:
    """The gears to label on a log-2 axis: every distinct gear used (3 and 6 as well as the
    powers of two), thinned to about `most` (a gear closer than 1/`most` of the axis's span
    to the one labelled below it is skipped; the largest is always labelled)."""
    used = sorted({g for gs_ in gears for g in gs_})
    if len(used) <= most:
        return used
    gap = math.log2(used[-1] / used[0]) / most
    kept = [used[0]]
    for g in used[1:-1]:
        if math.log2(g / kept[-1]) >= gap and math.log2(used[-1] / g) >= gap:
            kept.append(g)
    return [*kept, used[-1]]


def _runs(mask: Any) -> list[tuple[int, int]]:
    """(start, end) segment indices of each run of True in `mask` (end exclusive)."""
    import numpy as np

    step = np.diff(np.r_[0, np.asarray(mask, dtype=np.int8), 0])
    return list(zip(np.flatnonzero(step == 1).tolist(), np.flatnonzero(step == -1).tolist(),
                    strict=True))


def _tick(value: float, _: int) -> str:
    """A gear axis tick: gears are ints (1, 2, 4, not 1.0, 2.0, 4.0); none below 1."""
    return f"{value:.0f}" if value >= 1 else ""
