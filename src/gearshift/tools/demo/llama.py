"""The demo's real model: `transformers`' Llama (`LlamaForCausalLM`), small, random, seeded.

Two steps, each a function of tensors for the adaptive runner (`bindings`; both profiles on
one client: `profiles`):
- prefill, on the SEQLEN profile: `input_ids [1, S]` -> `logits [1, S, vocab]`. Attention is
  causal, so tokens padded after the last real one do not change the real tokens' logits.
- decode, on the BATCHSIZE profile: `input_ids [B, 1]` and a fixed-size KV cache
  `kv [layers, 2, B, kv_heads, context, head_dim]` (every sequence `context` tokens long) ->
  `logits [B, 1, vocab]` of the token at position `context`. The cache is an input of a
  static shape per gear, so a decode step is a static-shape graph; batch rows never attend to
  each other, so padded rows (zero cache, token 0) do not change the real rows' logits.

The eager reference of either step is the same function on the unpadded request. `DemoLlama`
is the model as `gearshift demo --model llama` runs it: each worker runs both profiles on it.
Needs the `demo` extra (`pip install 'gearshift[demo]'`); nothing is downloaded.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gearshift.core.dims import Dim
from gearshift.tools.demo.mix import DECODE, PREFILL
from gearshift.tools.demo.workload import SEQ

if TYPE_CHECKING:
    from gearshift.worker.profile import Profile
    from gearshift.worker.session import Client

BATCH = "BATCHSIZE"


@dataclass(frozen=True)
class LlamaShape:
    """The small Llama the demo runs: sizes of a `LlamaConfig`, and the decode context."""

    vocab: int = 256
    hidden: int = 64
    intermediate: int = 128
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    positions: int = 16384  # the longest prefill it takes (the shipped traces: 14050)
    context: int = 32  # tokens already in every decode sequence's cache

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


class Llama:
    """`LlamaForCausalLM` of `shape` with weights drawn from `seed` (the global RNG is left as
    it was); `prefill` and `decode` run it without gradients. `tokens` counts every token
    computed (decode: one per batch row), captures and replays alike."""

    def __init__(self, shape: LlamaShape | None = None, seed: int = 0) -> None:
        from transformers import LlamaConfig, LlamaForCausalLM

        self.shape = s = shape or LlamaShape()
        config = LlamaConfig(
            vocab_size=s.vocab,
            hidden_size=s.hidden,
            intermediate_size=s.intermediate,
            num_hidden_layers=s.layers,
            num_attention_heads=s.heads,
            num_key_value_heads=s.kv_heads,
            max_position_embeddings=s.positions + 1,
        )
        config._attn_implementation = "sdpa"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.model = LlamaForCausalLM(config).eval()
        forward = inspect.signature(self.model.forward).parameters
        self._cache_arg = "cache" if "cache" in forward else "past_key_values"  # renamed in 5.x
        self.tokens = 0
        self._lock = threading.Lock()  # the swap thread captures while requests replay

    def _count(self, n: int) -> None:
        with self._lock:
            self.tokens += n

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits `[1, S, vocab]` of a sequence `input_ids [1, S]`, no cache."""
        self._count(input_ids.numel())
        return self.model(input_ids=input_ids, use_cache=False).logits

    @torch.no_grad()
    def decode(self, input_ids: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """Logits `[B, 1, vocab]` of the next token of `B` sequences whose cache is `kv`
        (module docstring); `kv` itself is not written."""
        self._count(input_ids.shape[0])
        from transformers import DynamicCache

        context = kv.shape[-2]
        cache = DynamicCache(ddp_cache_data=[(layer[0], layer[1]) for layer in kv])
        position = torch.full_like(input_ids, context)
        out = self.model(
            input_ids=input_ids,
            position_ids=position,
            use_cache=True,
            **{self._cache_arg: cache},
        )
        return out.logits

    def cache(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The `kv` cache (decode's layout) of sequences `input_ids [B, T]`, by a prefill."""
        with torch.no_grad():
            out = self.model(input_ids=input_ids, use_cache=True)
        layers = out.past_key_values.layers
        return torch.stack([torch.stack([la.keys, la.values]) for la in layers])

    def inputs(self, profile: str, size: int, seed: int = 0) -> dict[str, torch.Tensor]:
        """Random inputs of one request of `size` (sequence length or batch size)."""
        g = torch.Generator().manual_seed(seed)
        s = self.shape
        if profile == PREFILL:
            return {"input_ids": torch.randint(s.vocab, (1, size), generator=g)}
        kv = torch.randn(s.layers, 2, size, s.kv_heads, s.context, s.head_dim, generator=g)
        return {"input_ids": torch.randint(s.vocab, (size, 1), generator=g), "kv": kv}


def bindings(llama: Llama, profile: str) -> tuple[Any, dict[str, tuple[str | None, ...]],
                                                  dict[str, torch.Tensor], tuple[Any, ...]]:
    """`(fn, inputs, example, outputs)` of one profile's step, as `Profile.runner` takes them."""
    if profile == PREFILL:
        return llama.prefill, {"input_ids": (None, "S")}, llama.inputs(PREFILL, 1), \
            (None, "S", None)
    if profile == DECODE:
        axes = {"input_ids": ("B", None), "kv": (None, None, "B", None, None, None)}
        return llama.decode, axes, llama.inputs(DECODE, 1), ("B", None, None)
    raise ValueError(f"unknown profile {profile!r}; known: {PREFILL}, {DECODE}")


def dims_for(profile: str, dims: Mapping[str, Dim]) -> dict[str, Dim]:
    """A trace's dims, checked to be the one dim `profile` buckets on."""
    want = SEQ if profile == PREFILL else BATCH
    if list(dims) != [want]:
        raise ValueError(f"the {profile} profile takes a trace of {want} only, got {list(dims)}")
    return dict(dims)


def profiles(client: Client, llama: Llama,
             dims: Mapping[str, Mapping[str, Dim]]) -> dict[str, Profile]:
    """Per profile (`dims`: profile -> its dims), its `Profile` on `client` (one device, one
    controller) with an adaptive runner of its step (`Profile.runner`): `run(**tensors)` routes,
    records and runs a request."""
    out = {}
    for name, d in dims.items():
        fn, inputs, example, outputs = bindings(llama, name)
        out[name] = profile = client.profile(name, dims_for(name, d))
        profile.runner(fn, inputs, example, outputs=outputs)
    return out


class DemoLlama:
    """The Llama as the demo's worker runs a model (`arm.Model`), one runner per profile of
    one dim: `x` holds token embeddings (`inputs_embeds`, so the worker's random inputs serve).
    SEQLEN: `x = [S, hidden]`, one causal prefill. BATCHSIZE: `x = [B, 1, hidden]`, a decode
    step, each row the next token of a sequence that continues one shared context (a fixed
    random cache of `context` tokens held here, expanded to B rows): static shapes per batch
    size, rows never see each other, and a row's output does not depend on which chunk of a
    split batch it runs in. `tokens` counts every token computed."""

    def __init__(self, shape: LlamaShape | None = None, seed: int = 0) -> None:
        self.llama = Llama(shape, seed)
        s = self.llama.shape
        self.width, self.heads, self.tokens = s.hidden, s.heads, 0
        self._kv = self.llama.inputs(DECODE, 1, seed=seed + 1)["kv"]
        self._lock = threading.Lock()

    @torch.no_grad()
    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        with self._lock:
            self.tokens += x.numel() // self.width
        return self.forward(x)

    @torch.no_grad()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The step, uncounted (what `torch.compile` traces: no lock, no counter)."""
        model = self.llama.model
        if x.dim() == 2:
            return model(inputs_embeds=x[None], use_cache=False).logits[0]
        if x.dim() != 3 or x.shape[1] != 1:
            raise ValueError(f"expected [S, hidden] or [B, 1, hidden], got {tuple(x.shape)}")
        from transformers import DynamicCache

        b = x.shape[0]
        kv = self._kv.expand(-1, -1, b, -1, -1, -1)
        cache = DynamicCache(ddp_cache_data=[(layer[0], layer[1]) for layer in kv])
        position = torch.full((b, 1), kv.shape[-2], dtype=torch.long)
        out = model(inputs_embeds=x, position_ids=position, use_cache=True,
                    **{self.llama._cache_arg: cache})
        return out.logits


ABOUT = (
    "transformers' LlamaForCausalLM, random weights (seeded): {layers} layers, hidden {hidden},"
    " {heads} heads ({kv_heads} KV), vocab {vocab}; prefill on SEQLEN, decode on BATCHSIZE"
    " (every row continues one shared {context}-token context)"
)


def about(shape: LlamaShape | None = None) -> str:
    """One line describing the demo's Llama, for the demo's report."""
    s = shape or LlamaShape()
    return ABOUT.format(**{k: getattr(s, k) for k in
                           ("layers", "hidden", "heads", "kv_heads", "vocab", "context")})
