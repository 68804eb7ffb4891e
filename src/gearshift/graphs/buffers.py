"""The static buffers an adaptive runner's graphs read their inputs from, and the example's
static parts every call must match.

One buffer per bound input, sized by the largest gears so far (`caps`, one per dim in the
transform's dim order); a graph's inputs are views of the leading rows of the buffers at its
variant's gears (`views`). A view beyond `caps` allocates larger buffers, which the variants
captured from then on use (older ones keep theirs until released); `resize` allocates
smaller ones for a re-staging. `footprint` gives their bytes, for the controller's memory
bound (`worker.measured`). `check` refuses a call whose static axes or dtypes are not the
example's (ShapeError naming the input: a graph cannot return another dtype).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import NoReturn

import torch

from gearshift.core.dims import Variant
from gearshift.errors import ShapeError
from gearshift.graphs.transform import Transform


class StaticBuffers:
    """The bound inputs' buffers of a runner of `transform`, on `device`, from `example`."""

    def __init__(self, transform: Transform, example: Mapping[str, torch.Tensor], caps: Variant,
                 device: torch.device) -> None:
        self.transform = transform
        self.names = tuple(transform.dims)
        self.device = device
        self.shapes = {  # per input: its static sizes, None on bound axes
            n: tuple(None if d else s for d, s in zip(axes, example[n].shape, strict=True))
            for n, axes in transform.inputs.items()
        }
        self.static = [  # (input, axis, size) of every static axis
            (n, axis, size)
            for n, shape in self.shapes.items()
            for axis, size in enumerate(shape)
            if size is not None
        ]
        self.dtypes = {n: example[n].dtype for n in transform.inputs}
        self._checks = tuple(  # per input: its dtype and (axis, size) of its static axes
            (n, dtype, tuple((axis, size) for m, axis, size in self.static if m == n))
            for n, dtype in self.dtypes.items())
        self.caps = caps
        self.buffers = self.allocate(caps)

    def allocate(self, caps: Variant) -> dict[str, torch.Tensor]:
        """New zeroed buffers at the gears `caps`."""
        at = dict(zip(self.names, caps, strict=True))
        buffers = {}
        for name in self.transform.bound:
            axes = zip(self.transform.inputs[name], self.shapes[name], strict=True)
            shape = [at[d] if s is None else s for d, s in axes]
            buffers[name] = torch.zeros(shape, dtype=self.dtypes[name], device=self.device)
        return buffers

    def resize(self, caps: Variant) -> None:
        """Buffers at `caps` from now on (the old ones go with their last view)."""
        self.caps = caps
        self.buffers = self.allocate(caps)

    def footprint(self) -> dict[str, tuple[int, int, int]]:
        """Per dim: the gear the buffers are sized at, their bytes in all, and the bytes of
        those with an axis on the dim (which grow with its largest gear)."""
        size = {n: b.numel() * b.element_size() for n, b in self.buffers.items()}
        total = sum(size.values())
        return {d: (cap, total, sum(n for name, n in size.items()
                                    if d in self.transform.inputs[name]))
                for d, cap in zip(self.names, self.caps, strict=True)}

    def views(self, gears: Variant) -> dict[str, torch.Tensor]:
        """Per bound input, the view of its buffer at `gears` (buffers grown to hold it)."""
        if any(map(operator.gt, gears, self.caps)):
            self.resize(tuple(map(max, gears, self.caps)))
        at = dict(zip(self.names, gears, strict=True))
        views = {}
        for name, buffer in self.buffers.items():
            for axis, dim in enumerate(self.transform.inputs[name]):
                if dim is not None:
                    buffer = buffer.narrow(axis, 0, at[dim])
            views[name] = buffer
        return views

    def check(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Static axes and dtypes as the example's: ShapeError naming the input otherwise
        (`_refuse`). One pass over the inputs (`_checks`)."""
        for name, dtype, static in self._checks:
            t = tensors[name]
            if t.dtype != dtype:
                self._refuse(tensors)
            if static:
                shape = t.shape
                for axis, size in static:
                    if shape[axis] != size:
                        self._refuse(tensors)

    def _refuse(self, tensors: Mapping[str, torch.Tensor]) -> NoReturn:
        """The ShapeError of a call `check` found wrong: dtypes first, then static axes."""
        for name, dtype in self.dtypes.items():
            if tensors[name].dtype != dtype:
                raise ShapeError(
                    f"{name} is {tensors[name].dtype}; the graphs were built for {dtype} (pass"
                    " the example's dtype: a graph cannot return another)"
                )
        for name, axis, size in self.static:
            if tensors[name].shape[axis] != size:
                raise ShapeError(
                    f"{name} axis {axis} is {tensors[name].shape[axis]}; the graphs were built"
                    f" for {size}"
                )
        raise AssertionError("check refused a call _refuse finds right")  # pragma: no cover
