"""The runner's padding probe: random inputs with about half a gear's rows, run padded, must
give (cut back) what the function gives on them unpadded (`graphs.padding`).

`Prober.check_eagerly` runs the function itself on the smallest initial gears that pad
(PaddingError if it differs), and split across them on splittable dims (`check_split`: a
function that mixes rows, such as causal attention, cannot be split); `Prober.check` compares
a graph's replay, through a callable the runner gives (it owns the buffers and the lock), once
per gear: a graph whose every gear has passed before is not probed again. A probe that differs
is run unpadded once more: a function whose unpadded runs differ (dropout: a model in train
mode) is refused for that, not for the padding (`padding.unstable`).
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
        that pad, gives (cut back) what it gives on the probe unpadded; and, on a splittable
        dim, split across that gear, what it gives unsplit (`check_split`)."""
        dims = self.transform.dims
        first = [next((g for g in gears[d] if padding.probe_size(dims[d], g) < g), gears[d][0])
                 for d in self.names]
        t = self.transform
        why = self._compare(first, lambda c, x: t.cut(t.leaves(t.fn(**t.transform(x, c)))[0], c))
        if why is not None:
            raise PaddingError(why)
        self.check_split(first)

    @torch.no_grad()
    def check_split(self, gears: Sequence[int]) -> None:
        """PaddingError unless fn, run on about one and a half of `gears` rows of each
        splittable dim cut into chunks of that gear (as a call over the largest gear runs),
        gives what it gives on the rows unsplit: a chunk sees none of the others' rows, so a
        function that mixes rows (causal attention reads every earlier one) is refused."""
        t, dims = self.transform, self.transform.dims
        sizes, at = {}, {}
        for d, g in zip(self.names, gears, strict=True):
            n = min(g + padding.probe_size(dims[d], g), dims[d].max) if dims[d].splittable else 0
            sizes[d], at[d] = (n, (g,)) if n > g else (padding.probe_size(dims[d], g), (g,))
        split = [d for d in self.names if sizes[d] > at[d][0]]
        if not split:
            return
        tensors = padding.probe(self.example, t.inputs, sizes, seed=sum(sizes.values()) + 1)
        whole = t.leaves(t.call(tensors, sizes))[0]
        diff = padding.mismatch(t.leaves(t(tensors, at))[0], whole)
        if diff is not None:
            again = padding.mismatch(t.leaves(t.call(tensors, sizes))[0], whole)
            raise PaddingError(padding.unstable(t.fn, again) if again is not None else
                               padding.unsplit(t.fn, {d: sizes[d] for d in split},
                                               {d: at[d][0] for d in split}, diff))

    def due(self, gears: Sequence[int]) -> tuple[Chunk, dict[str, torch.Tensor]] | None:
        """The probe `check` would run on the graph of `gears` (`probe`), None when it runs
        none: nothing padded, or every gear passed before."""
        return None if self._passed(gears) else self.probe(gears)

    def _passed(self, gears: Sequence[int]) -> bool:
        return all(g in self.checked[d] for d, g in zip(self.names, gears, strict=True))

    def check(self, gears: Sequence[int], replay: Replay,
              probe: tuple[Chunk, dict[str, torch.Tensor]] | None = None) -> str | None:
        """Why the graph of `gears`, run by `replay` on a padded probe (`probe`: the one `due`
        gave, else made here), does not give (cut back) what fn gives on the probe unpadded;
        None when it does, when nothing is padded or when every gear of it passed before."""
        if self._passed(gears):
            return None
        why = self._compare(gears, replay, probe)
        if why is None:
            for d, g in zip(self.names, gears, strict=True):
                self.checked[d].add(g)
        return why

    @torch.no_grad()
    def _compare(self, gears: Sequence[int], padded: Replay,
                 probe: tuple[Chunk, dict[str, torch.Tensor]] | None = None) -> str | None:
        probe = self.probe(gears) if probe is None else probe
        if probe is None:
            return None
        chunk, tensors = probe
        t = self.transform
        real = {d: s.size for d, s in chunk.items()}
        got = padded(chunk, tensors)
        want = t.leaves(t.call(tensors, real))[0]
        diff = padding.mismatch(got, want)
        if diff is None:
            return None
        again = padding.mismatch(t.leaves(t.call(tensors, real))[0], want)
        if again is not None:  # not the padding: fn is not deterministic
            return padding.unstable(t.fn, again)
        return padding.changed(t.fn, real, {d: s.gear for d, s in chunk.items()}, diff)
