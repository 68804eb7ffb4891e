"""The demo's hand-written model (`--model block`, the default): one transformer block (torch).

Its prefill cost, ~24 S H^2 + 2 S^2 H flops for S tokens, makes a padded token cost more than
its share, and a Llama step costs 10-15x a block step on the CPU, so the README's first command
replays enough requests in a minute for the policy's rounds (docs/tools.md).
"""

from __future__ import annotations

import math
import threading

import torch
import torch.nn.functional as F

from gearshift.tools.demo.workload import HEADS, WIDTH


class Model:
    """One pre-norm transformer block over `x = [..., S, width]`, as prefill runs it:
    `x += Wo attention(LN x)`, causal, `heads` heads (`F.scaled_dot_product_attention`, its
    CPU flash kernel), then `x += W2 gelu(W1 LN x)`. Causal attention makes padding after a
    sequence's last token harmless: no token sees a later one, so the real tokens' outputs
    do not depend on it (a padded row of a batch is a sequence of its own).
    `tokens` counts every token computed, captures and replays alike."""

    def __init__(self, width: int = WIDTH, heads: int = HEADS, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)

        def weight(rows: int, cols: int) -> torch.Tensor:
            return torch.randn(rows, cols, generator=g) / math.sqrt(rows)

        self.qkv, self.out = weight(width, 3 * width), weight(width, width)
        self.w1, self.w2 = weight(width, 4 * width), weight(4 * width, width)
        self.width, self.heads, self.tokens = width, heads, 0
        self._lock = threading.Lock()  # the swap thread captures while requests replay

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with self._lock:
            self.tokens += x.numel() // self.width
        return self.forward(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block, uncounted (what `torch.compile` traces: no lock, no counter)."""
        h = x.reshape(-1, *x.shape[-2:])  # [N, S, H]: 4-d heads take the flash kernel
        n, s, width = h.shape
        qkv = F.layer_norm(h, (width,)) @ self.qkv
        q, k, v = qkv.view(n, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = h + a.transpose(1, 2).reshape(n, s, width) @ self.out
        h = h + F.gelu(F.layer_norm(h, (width,)) @ self.w1) @ self.w2
        return h.view(x.shape)
