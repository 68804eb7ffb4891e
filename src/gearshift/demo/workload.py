"""The demo's workload: a trace's rows as requests, dealt to N workers (numpy, no torch).

Each row is one request whose raw sizes are the row's dims: the model gets an input
`x` of shape `[*sizes, width]`, so a request carries `prod(sizes)` useful tokens and costs
the tokens of its padded chunks (`padded_tokens`): compute is proportional to padded work.
Every dim starts on the power-of-two ladder covering the trace (`simulate.policy_dims`:
BATCHSIZE splittable, other dims not); the static baseline keeps those gears.

To fit the time asked for, the demo replays every `stride`-th row (the trace's shape and
order kept) and divides the policy's windows and intervals by `factor`, the trace's
duration over the expected duration of one run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from gearshift.dims import Dim, Gears, padded_work
from gearshift.simulate import policy_dims
from gearshift.trace import load_trace

# The problem at its worst: of the shipped traces' dims, the power-of-two ladder pads this one
# most (43.6 %; plan mode 14.5 %: `gearshift bench simulate`). One dim, so a new gear costs one
# capture per worker, and the most rows of the prefill traces.
DEFAULT_TRACE = "azure_conv_prefill"
PROFILE = "demo"


@dataclass(frozen=True)
class Workload:
    """The rows replayed: `sizes[dim][i]` is request i's raw size; `rows` in the trace."""

    trace: str
    dims: dict[str, Dim]
    sizes: dict[str, np.ndarray]
    duration: float
    rows: int
    stride: int = 1

    @property
    def events(self) -> int:
        return len(next(iter(self.sizes.values())))

    def every(self, stride: int) -> Workload:
        """Every `stride`-th row of the full trace (stride 1: all of it)."""
        assert self.stride == 1, "subsample the full workload"
        sizes = {d: v[::stride] for d, v in self.sizes.items()}
        return Workload(self.trace, self.dims, sizes, self.duration, self.rows, stride)

    def share(self, worker: int, workers: int) -> dict[str, np.ndarray]:
        """The rows worker `worker` of `workers` replays (round-robin, in trace order)."""
        return {d: v[worker::workers] for d, v in self.sizes.items()}

    def useful(self) -> np.ndarray:
        return useful_tokens(self.sizes)

    def padded(self, gears: Mapping[str, Gears] | None = None) -> np.ndarray:
        """Tokens each request costs on `gears` (default: the initial, power-of-two ones)."""
        return padded_tokens(self.dims, self.sizes, gears)


def load_workload(source: str) -> Workload:
    """The workload of a trace given by path or shipped name (TraceError if unreadable)."""
    trace = load_trace(source)
    dims = policy_dims(trace, "pow2")
    return Workload(trace.name, dims, dict(trace.dims), trace.duration, trace.events)


def useful_tokens(sizes: Mapping[str, np.ndarray]) -> np.ndarray:
    return np.prod(np.stack(list(sizes.values())), axis=0)


def padded_tokens(
    dims: Mapping[str, Dim],
    sizes: Mapping[str, np.ndarray],
    gears: Mapping[str, Gears] | None = None,
) -> np.ndarray:
    """Per request, the product over dims of its padded work (the sum of its chunks' gears):
    the tokens of all its chunks, which are the row-major product of every dim's chunks."""
    gears = gears or {d: dim.initial_gears for d, dim in dims.items()}
    work = [padded_work(gears[d], sizes[d], dim.splittable) for d, dim in dims.items()]
    return np.prod(np.stack(work), axis=0)


def stride_for(workload: Workload, per_token: float, budget: float) -> int:
    """The smallest stride whose static run, at `per_token` seconds per padded token (all
    workers together), fits in `budget` seconds."""
    return max(1, math.ceil(float(workload.padded().sum()) * per_token / budget))
