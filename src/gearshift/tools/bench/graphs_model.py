"""The model and gears of `gearshift bench graphs` (its in-process figures and its workers).

A small transformer: pre-norm blocks (causal attention, GELU MLP 4x), x of [B, S, width];
gears BATCHSIZE 1..64 (splittable) x SEQLEN 1, 16, 64. Outputs are compared with eager ones
within TOLERANCE (float32; a padded matmul may take another kernel, so not bit for bit).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from gearshift.core.dims import Dim

TOLERANCE = {"rtol": 1e-4, "atol": 1e-4}
BATCH = (1, 2, 4, 8, 16, 32, 64)
SEQ = (1, 16, 64)


def dims() -> dict[str, Dim]:
    return {
        "BATCHSIZE": Dim(gears=list(BATCH), max=BATCH[-1], splittable=True),
        "SEQLEN": Dim(gears=list(SEQ), max=SEQ[-1]),
    }


class Model:
    """`layers` pre-norm transformer blocks of width `width`; `x`: [B, S, width]. `op(fn, *args)`
    runs each block (default: calls it; the tests' fake device allocates and records it)."""

    def __init__(self, width: int, layers: int, heads: int, device: str, seed: int = 0,
                 op: Callable[..., torch.Tensor] | None = None) -> None:
        g = torch.Generator().manual_seed(seed)

        def weight(rows: int, cols: int) -> torch.Tensor:
            return (torch.randn(rows, cols, generator=g) / math.sqrt(rows)).to(device)

        self.width, self.heads = width, heads
        self.op = op or (lambda fn, *args: fn(*args))
        self.blocks = [
            (weight(width, 3 * width), weight(width, width), weight(width, 4 * width),
             weight(4 * width, width))
            for _ in range(layers)
        ]

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        for weights in self.blocks:
            x = self.op(self._block, x, *weights)
        return x

    def _block(self, x: torch.Tensor, qkv_w: torch.Tensor, out_w: torch.Tensor,
               w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = (F.layer_norm(x, (h,)) @ qkv_w).view(b, s, 3, self.heads, -1).unbind(2)
        a = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + a.transpose(1, 2).reshape(b, s, h) @ out_w
        return x + F.gelu(F.layer_norm(x, (h,)) @ w1) @ w2
