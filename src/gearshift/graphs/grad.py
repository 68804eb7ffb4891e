"""The grad mode gearshift runs a function under: one for all its runs, chosen by its caller.

Graphs hold no autograd state, so every run of `fn` (eager chunks, captures, compiles, probes,
measuring replays, on any thread) is made under one mode: `torch.inference_mode` when the
transform's first call ran under it, else `no_grad` outside inference mode. Graphs are then
built for what the caller runs under (a runner built inside `inference_mode` holds inference
tensors, which the swap thread may only write inside it), a compiled function's grad-mode
guard always holds, and no output carries a grad_fn, eager or replayed. An input that requires
grad while the caller records gradients is refused (`refuse_grad`): it would get none.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import torch

from gearshift.errors import ShapeError

_ALREADY = contextlib.nullcontext()  # reentrant and stateless: one for every caller


def mode(inference: bool) -> contextlib.AbstractContextManager[Any]:
    """torch.inference_mode if `inference`, else no_grad outside inference mode; a block that
    changes nothing when the caller is in that mode already (a serving loop's usual case)."""
    if inference:
        return _ALREADY if torch.is_inference_mode_enabled() else torch.inference_mode()
    if torch.is_grad_enabled() or torch.is_inference_mode_enabled():
        return _NoGrad()
    return _ALREADY


class _NoGrad:
    """no_grad, outside inference mode (left for the block if the caller is in it); a plain
    class: the request path enters it on every call."""

    __slots__ = ("_grad", "_inner")

    def __enter__(self) -> None:
        self._inner = torch.inference_mode(False) if torch.is_inference_mode_enabled() else None
        if self._inner is not None:
            self._inner.__enter__()
        self._grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)

    def __exit__(self, *exc: object) -> None:
        torch._C._set_grad_enabled(self._grad)
        if self._inner is not None:
            self._inner.__exit__(*exc)


def refuse_grad(tensors: Mapping[str, torch.Tensor]) -> None:
    """ShapeError naming the inputs that require grad, when the caller records gradients."""
    if not torch.is_grad_enabled():
        return
    wanting = [n for n, t in tensors.items() if t.requires_grad]
    if wanting:
        raise ShapeError(
            f"{', '.join(wanting)} require(s) grad: gearshift runs fn as inference graphs,"
            f" whose outputs carry no grad_fn (nor do its eager runs'), so no gradient would"
            f" reach them; pass them detached (x.detach()) or call under torch.no_grad() or"
            f" torch.inference_mode()")
