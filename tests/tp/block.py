"""A tensor-parallel Llama-style block for the gloo harness: RMSNorm, attention with its heads
split across ranks (q, k, v column-parallel, o row-parallel: one all-reduce), RMSNorm, a
SwiGLU MLP (gate and up column-parallel, down row-parallel: one all-reduce). Causal attention
keeps each real row independent of the padded rows after it, so a padded run cut back equals
the unpadded one. `reference` is the unsharded block on one process."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

HIDDEN, HEADS, INTER = 32, 4, 64
HEAD_DIM = HIDDEN // HEADS
DTYPE = torch.float64  # exact enough for a 1e-10 comparison of sharded and unsharded sums


@dataclass(frozen=True)
class Weights:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    norm1: torch.Tensor
    norm2: torch.Tensor
    heads: int


def weights(seed: int = 0) -> Weights:
    """The unsharded block's weights, the same on every process for one `seed`."""
    g = torch.Generator().manual_seed(seed)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=DTYPE) / math.sqrt(shape[-1])

    return Weights(w(HIDDEN, HIDDEN), w(HIDDEN, HIDDEN), w(HIDDEN, HIDDEN), w(HIDDEN, HIDDEN),
                   w(INTER, HIDDEN), w(INTER, HIDDEN), w(HIDDEN, INTER),
                   1 + 0.1 * torch.randn(HIDDEN, generator=g, dtype=DTYPE),
                   1 + 0.1 * torch.randn(HIDDEN, generator=g, dtype=DTYPE), HEADS)


def shard(full: Weights, rank: int, size: int) -> Weights:
    """Rank `rank`'s shard of `size`: its heads' rows of q, k, v and columns of o, its slice
    of the MLP's inner rows (gate, up) and columns (down)."""
    assert HEADS % size == 0 and INTER % size == 0
    rows = slice(rank * HIDDEN // size, (rank + 1) * HIDDEN // size)
    inner = slice(rank * INTER // size, (rank + 1) * INTER // size)
    return Weights(full.q[rows], full.k[rows], full.v[rows], full.o[:, rows],
                   full.gate[inner], full.up[inner], full.down[:, inner],
                   full.norm1, full.norm2, HEADS // size)


def _norm(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g


def _attention(h: torch.Tensor, w: Weights) -> torch.Tensor:
    s = h.shape[0]
    q, k, v = (torch.nn.functional.linear(h, m).view(s, w.heads, HEAD_DIM).transpose(0, 1)
               for m in (w.q, w.k, w.v))
    a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return torch.nn.functional.linear(a.transpose(0, 1).reshape(s, w.heads * HEAD_DIM), w.o)


def _mlp(h: torch.Tensor, w: Weights) -> torch.Tensor:
    lin = torch.nn.functional.linear
    return lin(torch.nn.functional.silu(lin(h, w.gate)) * lin(h, w.up), w.down)


def forward(x: torch.Tensor, w: Weights, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The block on `x` [S, HIDDEN] with shard `w`; with `group`, each row-parallel partial sum
    is all-reduced over it (the collectives a captured graph would hold)."""
    o = _attention(_norm(x, w.norm1), w)
    if group is not None:
        dist.all_reduce(o, group=group)
    x = x + o
    m = _mlp(_norm(x, w.norm2), w)
    if group is not None:
        dist.all_reduce(m, group=group)
    return x + m


def reference(x: torch.Tensor, full: Weights) -> torch.Tensor:
    """The unsharded block on one process (no collective)."""
    return forward(x, full)
