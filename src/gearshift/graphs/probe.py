"""The runner's padding probe: random inputs with about half a gear's rows, run padded, must
give (cut back) what the function gives on them unpadded (`graphs.padding`).

`Prober.check_eagerly` runs the function itself on the smallest initial gears that pad
(PaddingError if it differs); `Prober.check` compares a graph's replay, through a callable the
runner gives (it owns the buffers and the lock), once per gear: a graph whose every gear has
passed before is not probed again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from gearshift.core.dims import Gears
from gearshift.errors import PaddingError
from gearshift.graphs import padding
from gearshift.graphs.transform import Chunk, Span, Transform

Replay = Callable[[Chunk, dict[str, torch.Tensor]], list[torch.Tensor]]


class Prober:
    """Padding probes of one transform's function, shaped and typed as `example`."""

    def __init__(self, transform: Transform, example: Mapping[str, torch.Tensor]) -> None:
        self.transform = transform
        self.names = tuple(transform.dims)
        self.example = {n: t.detach().clone() for n, t in example.items()}
        self.checked: dict[str, set[int]] = {d: set() for d in self.names}  # gears that passed

    def probe(self, gears: Sequence[int]) -> tuple[Chunk, dict[str, torch.Tensor]] | None:
        """A chunk of about half these gears' rows (`padding.probe_size`) and random inputs of
        its real sizes; None when no dim would be padded."""
        dims = self.transform.dims
        spans = {d: Span(0, padding.probe_size(dims[d], g), g)
                 for d, g in zip(self.names, gears, strict=True)}
        if all(s.size == s.gear for s in spans.values()):
            return None
        sizes = {d: s.size for d, s in spans.items()}
        return spans, padding.probe(self.example, self.transform.inputs, sizes, seed=sum(gears))

    @torch.no_grad()
    def check_eagerly(self, gears: Mapping[str, Gears]) -> None:
        """PaddingError unless fn, run eagerly on a padded probe of the smallest of `gears`
        that pad, gives (cut back) what it gives on the probe unpadded."""
        dims = self.transform.dims
        first = [next((g for g in gears[d] if padding.probe_size(dims[d], g) < g), gears[d][0])
                 for d in self.names]
        t = self.transform
        why = self._compare(first, lambda c, x: t.cut(t.leaves(t.fn(**t.transform(x, c)))[0], c))
        if why is not None:
            raise PaddingError(why)

    def check(self, gears: Sequence[int], replay: Replay) -> str | None:
        """Why the graph of `gears`, run by `replay` on a padded probe, does not give (cut
        back) what fn gives on the probe unpadded; None when it does, when nothing is padded
        or when every gear of it passed before."""
        if all(g in self.checked[d] for d, g in zip(self.names, gears, strict=True)):
            return None
        why = self._compare(gears, replay)
        if why is None:
            for d, g in zip(self.names, gears, strict=True):
                self.checked[d].add(g)
        return why

    @torch.no_grad()
    def _compare(self, gears: Sequence[int], padded: Replay) -> str | None:
        probe = self.probe(gears)
        if probe is None:
            return None
        chunk, tensors = probe
        t = self.transform
        real = {d: s.size for d, s in chunk.items()}
        diff = padding.mismatch(padded(chunk, tensors), t.leaves(t.call(tensors, real))[0])
        if diff is None:
            return None
        return padding.changed(t.fn, real, {d: s.gear for d, s in chunk.items()}, diff)
