"""A graph runner of one batch dim: one graph per gear over one static buffer pair.

Every gear's graph is captured on the first b rows of the same `static_in`
/ `static_out`. A run copies its rows in, zeroes only the padding rows
`[bs, b)` (leftovers of a larger batch), replays, and returns a clone (the
next replay overwrites `static_out`). No gear, an uncaptured gear, or
`force_eager` runs `fn(x)` and leaves the buffers untouched. `run` never captures.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from gearshift.core.dims import gear_for, normalize_gears
from gearshift.graphs.backends import Graph, backend_for


class GraphRunner:
    def __init__(
        self,
        fn: Callable[[torch.Tensor], torch.Tensor],
        gears: Sequence[int],
        hidden: int,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device = "cpu",
    ) -> None:
        self.fn = fn
        self.gears = normalize_gears(gears)
        self.backend = backend_for(device)
        self.static_in = torch.zeros(self.gears[-1], hidden, dtype=dtype, device=device)
        self.static_out = torch.zeros_like(self.static_in)
        self.graphs: dict[int, Graph] = {}
        self.stats: dict[str, Any] = {"replays": 0, "eager": 0, "last_gear": None}

    def capture(self) -> None:
        """One graph per gear on the first b rows, largest first."""
        for b in reversed(self.gears):
            graph = self.backend.graph(functools.partial(self._body, b))
            graph.capture()
            self.graphs[b] = graph

    def _body(self, b: int) -> None:
        self.static_out[:b].copy_(self.fn(self.static_in[:b]))

    def run(self, x: torch.Tensor, force_eager: bool = False) -> torch.Tensor:
        bs = x.shape[0]
        b = gear_for(self.gears, bs)
        if force_eager or b not in self.graphs:
            self.stats["eager"] += 1
            return self.fn(x)
        self.static_in[:bs].copy_(x)
        self.static_in[bs:b].zero_()
        self.graphs[b].replay()
        self.stats["replays"] += 1
        self.stats["last_gear"] = b
        return self.static_out[:bs].clone()
