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
from collections.abc import Iterator, Mapping

import torch

from gearshift.errors import ShapeError


def mode(inference: bool) -> contextlib.AbstractContextManager[None]:
    """torch.inference_mode if `inference`, else no_grad outside inference mode."""
    return torch.inference_mode() if inference else _no_grad()


@contextlib.contextmanager
def _no_grad() -> Iterator[None]:
    with torch.inference_mode(False), torch.no_grad():
        yield


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
