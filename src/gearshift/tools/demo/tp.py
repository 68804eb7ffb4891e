"""The demo's Llama tensor parallel (`--tp N`): a rank's shard and its gloo communicators (torch).

`ShardedLlama` is `llama.DemoLlama` (same seed, same weights) cut the way tensor-parallel
engines cut it: in every layer q, k and v (`q_proj`, `k_proj`, `v_proj`) and the MLP's gate and
up projections are column-parallel (this rank's attention heads, its KV heads, its slice of the
MLP's inner width), `o_proj` and `down_proj` row-parallel, each wrapped in `AllReduced` (its
partial sums all-reduced over the model's communicator), and the decode step's fixed KV cache
holds this rank's KV heads only. The embeddings, the norms and `lm_head` are replicated (every
rank computes them whole): the model is small, and its logits come out whole on every rank.
Transformers' own modules run the step; only the weights and the two wrappers change. `N` must
divide the attention heads, the KV heads and the MLP's inner width (`tp_refusal`).

`join` makes an instance's process group (gloo over TCP on 127.0.0.1, every collective bounded
by COLLECTIVE_SECONDS: a rank that is gone fails its peers' next collective instead of hanging
them) and two more communicators: the engine's step broadcast and the demo's own check.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

from gearshift.tools.demo.llama import DemoLlama, LlamaShape

COLLECTIVE_SECONDS = 60.0  # a collective waiting longer raises (a loaded machine's captures)


def tp_refusal(size: int, shape: LlamaShape | None = None) -> str | None:
    """Why the Llama cannot run `size` ranks of tensor parallel, or None."""
    s = shape or LlamaShape()
    if all(n % size == 0 for n in (s.heads, s.kv_heads, s.intermediate)):
        return None
    fits = [n for n in range(1, s.kv_heads + 1)
            if all(m % n == 0 for m in (s.heads, s.kv_heads, s.intermediate))]
    return (f"--tp {size} must divide the Llama's {s.heads} attention heads, {s.kv_heads} KV "
            f"heads and MLP width {s.intermediate}: use {' or '.join(map(str, fits))}")


@dataclass(frozen=True)
class Communicators:
    """One rank's communicators: the model's all-reduces (the default group), the engine's step
    broadcast and the demo's check (each step's gears all-gathered outside gearshift)."""

    rank: int
    size: int
    model: dist.ProcessGroup
    engine: dist.ProcessGroup
    check: dist.ProcessGroup


def join(rank: int, size: int, port: int,
         seconds: float = COLLECTIVE_SECONDS) -> Communicators:
    """Join the instance's gloo process group on 127.0.0.1:`port` as `rank` of `size`."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=seconds))
    engine = dist.new_group(backend="gloo")
    check = dist.new_group(backend="gloo")
    return Communicators(rank, size, dist.group.WORLD, engine, check)


def leave() -> None:
    """Destroy this process's process group (its communicators), if any."""
    if dist.is_initialized():
        dist.destroy_process_group()


class AllReduced(torch.nn.Module):
    """A row-parallel linear: `linear`'s partial sums, all-reduced over `group`."""

    def __init__(self, linear: torch.nn.Linear, group: dist.ProcessGroup) -> None:
        super().__init__()
        assert linear.bias is None, "a row-parallel bias would be added once per rank"
        self.linear, self.group = linear, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        dist.all_reduce(y, group=self.group)
        return y


def _cut(linear: torch.nn.Linear, rows: slice | None, cols: slice | None) -> torch.nn.Linear:
    """A linear of `linear`'s weight rows (outputs) `rows` or columns (inputs) `cols`."""
    weight = linear.weight.data[rows or slice(None), cols or slice(None)].clone()
    out = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    out.weight.data = weight
    return out.eval()


class ShardedLlama(DemoLlama):
    """Rank `rank` of `size` of the demo's Llama (module docstring), all-reducing over `group`.
    `seen` is `[calls, rows]` of the function since the caller last reset it: the padded rows
    (sequence length or batch size) each call ran, what the demo all-gathers to check that every
    rank ran the same gear."""

    def __init__(self, rank: int, size: int, group: dist.ProcessGroup,
                 shape: LlamaShape | None = None, seed: int = 0) -> None:
        super().__init__(shape, seed)
        s = self.llama.shape
        why = tp_refusal(size, s)
        if why is not None:
            raise ValueError(why)

        def part(n: int, width: int = 1) -> slice:
            return slice(rank * n // size * width, (rank + 1) * n // size * width)

        heads, kv = part(s.heads, s.head_dim), part(s.kv_heads, s.head_dim)
        inner = part(s.intermediate)
        for layer in self.llama.model.model.layers:
            a, m = layer.self_attn, layer.mlp
            a.q_proj, a.k_proj, a.v_proj = (_cut(p, cut, None) for p, cut in
                                            ((a.q_proj, heads), (a.k_proj, kv), (a.v_proj, kv)))
            a.o_proj = AllReduced(_cut(a.o_proj, None, heads), group)
            m.gate_proj, m.up_proj = _cut(m.gate_proj, inner, None), _cut(m.up_proj, inner, None)
            m.down_proj = AllReduced(_cut(m.down_proj, None, inner), group)
        self._kv = self._kv[:, :, :, part(s.kv_heads)].contiguous()
        self.seen = [0, 0]

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.seen = [self.seen[0] + 1, self.seen[1] + x.shape[0]]
        return super().__call__(x)


def gathered(check: dist.ProcessGroup, size: int, values: list[int]) -> list[list[int]]:
    """`values` of every rank (all-gathered on the check communicator), in rank order."""
    mine = torch.tensor(values, dtype=torch.int64)
    out = [torch.zeros_like(mine) for _ in range(size)]
    dist.all_gather(out, mine, group=check)
    return [t.tolist() for t in out]
