"""What a call copies into and out of a captured variant: planned once for a one-chunk call.

A call of one chunk per dim on a ready variant (the request path's common case) writes its
rows into the leading rows of the variant's static inputs, fills the rest of each bound axis
with its dim's pad value, sets the variant's lengths inputs to its real sizes, replays, and
copies the real rows of every output out. Which views of the static tensors those are depends
only on the variant's `Captured` and the call's sizes, so a `Plan` holds them, made by the
first call of those sizes and kept (`Plans`, at most MAX_PLANS; once full, cleared) for every
later one: the step runs no `narrow` and no loop over axes. A plan belongs to the captured
variant it was made for (`Plan.captured`, checked by identity at each use), so a variant
recaptured (re-staged, released and captured again) never runs an older plan; its runner
clears them whenever its variants change, so that no plan keeps an old buffer alive.

Any other chunk (of a split call, or on a covering variant) is copied per call (`replay`).
The views are exact: a bound axis of input `x` is viewed at the chunk's size, the sizes the
caller's tensors were checked to have (`Transform.check`), so `view.copy_(x)` copies every
element and broadcasts none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_unflatten

from gearshift.core.dims import Variant
from gearshift.graphs.transform import Chunk, Transform

MAX_PLANS = 4096  # plans kept per runner (once full, cleared and made anew)
_ALONE = object()  # a stand-in leaf: whether fn's output is one tensor, not a structure


@dataclass(frozen=True, eq=False)
class Plan:
    """One call's copies on `captured` (see the module): `pads` (view, pad value) filled
    first, then `into` (input name, view) copied from the call's tensors (unbound inputs'
    buffers included), `lengths` (tensor, real size) set; after the replay, `out` (one view
    per output leaf) copied out, returned as is when `alone` (fn returns one tensor)."""

    captured: Any
    pads: tuple[tuple[torch.Tensor, float], ...]
    into: tuple[tuple[str, torch.Tensor], ...]
    lengths: tuple[tuple[torch.Tensor, int], ...]
    out: tuple[torch.Tensor, ...]
    alone: bool


def plan(transform: Transform, captured: Any, chunk: Chunk,
         unbound: Mapping[str, torch.Tensor]) -> Plan:
    """The plan of `chunk` (one span per dim, each from row 0) on `captured` (its `inputs`,
    `lengths`, `leaves` and `spec`; `transform.fill` and `cut` over its views, made once)."""
    pads, into = [], []
    for name in transform.bound:
        out = region = captured.inputs[name]
        for axis, dim in enumerate(transform.inputs[name]):
            if dim is None:
                continue
            size = chunk[dim].size
            if pad := out.shape[axis] - size:  # the last bound axis wins at corners, as fill
                region = region.narrow(axis, 0, size)
                pads.append((out.narrow(axis, size, pad), transform.dims[dim].pad_value))
        into.append((name, region))
    into += unbound.items()
    lengths = tuple((captured.lengths[n], chunk[d].size) for n, d in transform.lengths.items())
    out = tuple(transform.cut(captured.leaves, chunk))  # views of the graph's outputs
    alone = len(out) == 1 and tree_unflatten([_ALONE], captured.spec) is _ALONE
    return Plan(captured, tuple(pads), tuple(into), lengths, out, alone)


def replay(transform: Transform, captured: Any, tensors: Mapping[str, torch.Tensor],
           chunk: Chunk) -> list[torch.Tensor]:
    """Any chunk (a split call's too) unplanned: padded into `captured`'s inputs
    (`Transform.fill`), replayed, its output leaves copied out (`Transform.cut`: the next
    replay rewrites the graph's). Under the runner's replay lock."""
    transform.fill(captured.inputs, tensors, chunk)
    for name, dim in transform.lengths.items():
        captured.lengths[name].fill_(chunk[dim].size)
    captured.graph.replay()
    return transform.cut(captured.leaves, chunk, copy=True)


class Plans(dict[tuple[Variant, tuple[int, ...]], Plan]):
    """The plans of one runner by (variant, raw sizes in dim order), read and kept under the
    runner's replay lock; `keep` stores a new one (for a missing or stale one)."""

    def keep(self, at: tuple[Variant, tuple[int, ...]], made: Plan) -> Plan:
        if len(self) >= MAX_PLANS:
            self.clear()
        self[at] = made
        return made
