"""The device a replay runs on (`Device`): what a capture costs, how many workers capture, what
a graph and the static buffers hold, and the memory bound a priced replay runs under."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gearshift.core.config import PolicyConfig
from gearshift.core.costs import Line, Prices, buffer_bytes
from gearshift.core.dims import Dim
from gearshift.core.memory import bound, graph_bytes

PROFILE = "trace"  # the one profile of a replay: every trace column is one of its dims
ZERO = Line()  # captures free


@dataclass(frozen=True)
class Device:
    """The device a replay runs on: a capture costs `capture` seconds (A + B·gear) on each of
    `workers` workers; `priced` tells the policy so (`Prices`: the dims' `cost` then reads
    as device seconds). Every gear captured counts once per worker: each added, and the
    initial ones at the start, or with `lazy` only those that traffic reaches (a worker
    captures a start-up gear the first time a request needs it). A graph of a dim holds
    `bytes[dim]` (A + B·gear) on each worker, else `memory.graph_bytes`'s model; priced, the
    policy's memory bound counts them (`memory.bound`). `buffers[dim]` (A + B·gear, the
    largest gear of the dim, on each worker) models the static input buffers the graphs
    share, counted once at the largest gears (`costs.buffer_bytes`); none by default.
    `memory` is the device's memory in bytes, as its workers report it: the bound is never
    under `graph_memory_floor_ratio` of it (None: unknown, no such floor)."""

    capture: Line = ZERO
    workers: int = 1
    priced: bool = False
    lazy: bool = False
    bytes: Mapping[str, Line] | None = None
    buffers: Mapping[str, Line] | None = None
    memory: float | None = None

    def graph_bytes(self, dim: str) -> Line:
        return graph_bytes((self.bytes or {}).get(dim, Line()))

    def prices(self, dims: Mapping[str, Dim]) -> dict[str, dict[str, Prices]] | None:
        return {PROFILE: self._prices(dims)} if self.priced else None

    def _prices(self, dims: Mapping[str, Dim]) -> dict[str, Prices]:
        return {d: Prices(self.capture, self.workers, bytes=self.graph_bytes(d),
                          buffers=(self.buffers or {}).get(d, Line())) for d in dims}

    def buffer_bytes(self, dims: Mapping[str, Dim], tops: Mapping[str, int]) -> float:
        """The static buffers at the largest gears `tops`, on every worker (0: not modelled)."""
        return buffer_bytes(self._prices(dims), tops) if self.buffers else 0.0

    def budget(self, dims: Mapping[str, Dim], config: PolicyConfig) -> float | None:
        """The memory bound a priced replay of `dims` runs under (None: unpriced, or none)."""
        prices = self.prices(dims)
        return bound({PROFILE: dims}, prices, config, self.memory) if prices else None

    def seconds(self, gears: Sequence[int]) -> float:
        return float(self.capture(np.asarray(gears, float)).sum()) * self.workers
