"""The demo's workload: a trace's rows as requests (numpy, no torch).

Each row is one request of one profile (a prefill, or a decode step of a trace without SEQLEN)
whose raw sizes are the row's dims; the block (`MODEL`) gets `x = [*sizes, WIDTH]` and attends
over SEQLEN, the last dim (a trace without SEQLEN runs every row as sequences of one token). A
request carries `prod(sizes)` useful tokens and runs its padded chunks: `padded_tokens` tokens,
and `padded_pairs` (tokens x sequence length), which attention's cost follows. The dims are
the simulator's static ones (`simulate.policy_dims`); the adaptive run prices SEQLEN with the
calibrated model (`Cost.priced`). A run replays one row in `stride` (`Workload.every`; the
profiles of a run together: `mix.Mix`); how the demo sizes and scales its runs: docs/tools.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gearshift.core.dims import Dim, Gears, padded_work
from gearshift.tools.simulate import policy_dims
from gearshift.tools.trace import load_trace

# The problem at its worst: of the shipped traces' dims, the power-of-two ladder pads this one
# most (`gearshift bench simulate`). One dim, so a new gear costs one capture per worker, and
# the most rows of the prefill traces.
DEFAULT_TRACE = "azure_conv_prefill"
LLAMA_TRACE = "azure_conv"  # --model llama's default: a source, both profiles (`mix.load_mix`)
PROFILE = "demo"  # the profile of a run of one trace
SEQ = "SEQLEN"  # the dim attention runs over
WIDTH, HEADS = 16, 1  # the model's features per token, and its attention heads
HEAD = "one head" if HEADS == 1 else f"{HEADS} heads"
MODEL = (
    f"one pre-norm transformer block, H = {WIDTH}: causal self-attention ({HEAD}) and a GELU "
    "MLP; S tokens cost ~24 S H^2 + 2 S^2 H flops, as in prefill, so padding costs more than "
    "its share of tokens"
)


@dataclass(frozen=True)
class Workload:
    """The rows replayed: `sizes[dim][i]` is request i's raw size, `times[i]` its time (seconds
    since the trace's first row); `rows` in the trace."""

    trace: str
    dims: dict[str, Dim]
    sizes: dict[str, np.ndarray]
    times: np.ndarray
    duration: float
    rows: int
    stride: float = 1.0

    @property
    def events(self) -> int:
        return len(next(iter(self.sizes.values())))

    def every(self, stride: float) -> Workload:
        """Rows floor(i x stride) of the full trace, i = 0, 1, ... (stride 1: all of it)."""
        assert self.stride == 1 and stride >= 1, "subsample the full workload"
        rows = np.floor(np.arange(0, self.events, stride)).astype(np.int64)
        sizes = {d: v[rows] for d, v in self.sizes.items()}
        times = self.times[rows]
        return Workload(self.trace, self.dims, sizes, times, self.duration, self.rows, stride)

    def useful(self) -> np.ndarray:
        return useful_tokens(self.sizes)

    def padded(self, gears: Mapping[str, Gears] | None = None) -> np.ndarray:
        """Tokens each request costs on `gears` (default: the initial, power-of-two ones)."""
        return padded_tokens(self.dims, self.sizes, gears)


@dataclass(frozen=True)
class Cost:
    """Seconds the model takes: `per_call` a chunk, `per_token` a token (projections, MLP),
    `per_pair` a token per token of its sequence (causal attention)."""

    per_call: float
    per_token: float
    per_pair: float

    def seconds(self, calls: float, tokens: float, pairs: float) -> float:
        return self.per_call * calls + self.per_token * tokens + self.per_pair * pairs

    def priced(self, dims: Mapping[str, Dim]) -> dict[str, Dim]:
        """`dims` with SEQLEN's `cost` set to one sequence's seconds at each length (`Dim.work`):
        plan mode then minimises padded compute, not padded tokens. Other dims keep counting
        elements (a chunk's cost is linear in them); without a rising fit, SEQLEN does too."""
        poly = tuple(max(0.0, c) for c in (self.per_call, self.per_token, self.per_pair))
        if SEQ not in dims or not any(poly[1:]):
            return dict(dims)
        return {d: dataclasses.replace(dim, cost=poly) if d == SEQ else dim
                for d, dim in dims.items()}

    @classmethod
    def fit(cls, samples: Sequence[tuple[int, int, float]]) -> Cost:
        """Least squares on the relative error over timed calls `(tokens, pairs, seconds)`."""
        x = np.array([(1.0, t, p) for t, p, _ in samples])
        y = np.array([s for *_, s in samples])
        coef = np.linalg.lstsq(x / y[:, None], np.ones(len(y)), rcond=None)[0]
        return cls(*map(float, coef))


def load_workload(source: str) -> Workload:
    """The workload of a trace given by path or shipped name (TraceError if unreadable), with
    SEQLEN, the sequence axis, as the last dim."""
    trace = load_trace(source)
    dims = policy_dims(trace, "static")
    order = sorted(dims, key=lambda d: d == SEQ)
    assert SEQ not in dims or not dims[SEQ].splittable, "one chunk per sequence"
    return Workload(
        trace.name,
        {d: dims[d] for d in order},
        {d: trace.dims[d] for d in order},
        trace.t - trace.t[0],
        trace.duration,
        trace.events,
    )


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


def padded_pairs(
    dims: Mapping[str, Dim],
    sizes: Mapping[str, np.ndarray],
    gears: Mapping[str, Gears] | None = None,
) -> np.ndarray:
    """Per request, its padded tokens times its padded sequence length (SEQLEN runs as one
    chunk); the tokens alone without SEQLEN."""
    gears = gears or {d: dim.initial_gears for d, dim in dims.items()}
    tokens = padded_tokens(dims, sizes, gears)
    return tokens * padded_work(gears[SEQ], sizes[SEQ], False) if SEQ in dims else tokens
