"""Transform and recover: run a call of any size as padded, gear-sized chunks.

A profile binds input axes to symbols, e.g. `inputs={"x": ("B", "S", None),
"mask": ("B", "S")}`, and `symbols` maps each symbol to one of its dims
(default: every dim name to itself, and `B` → `BATCHSIZE`, `S` → `SEQLEN`).
Every call is checked: ranks, bounds, and that all axes of one symbol agree.

- tile: per dim, `chunks_for` its gears cuts the raw size into spans; a chunk is
  one span per dim, and the chunks (a `Tiling`) are the row-major product of the
  spans. A non-splittable dim over its largest gear makes the whole call eager
  (no tiling).
- transform: a chunk's rows of every bound input, padded on each bound axis up
  to its gear with the dim's `pad_value` (the last bound axis wins at corners).
- recover: each chunk's outputs sliced back to its rows, then concatenated.

Output axes come from torch's own symbolic shapes (a fake-tensor run with the
bound axes dynamic, once per transform) unless declared with `outputs=`. An
output axis may be exactly one symbol or static; anything else (`B*S`) must be
declared or avoided.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from gearshift.core.dims import Dim, Gears, chunks_for
from gearshift.errors import ShapeError

Axes = tuple[str | None, ...]  # per tensor axis: the dim it carries, or None (static)
Chunk = dict[str, "Span"]
DEFAULT_SYMBOLS = {"B": "BATCHSIZE", "S": "SEQLEN"}
_TRACE_SIZES = (3, 5, 7, 11, 13, 17, 19, 23)  # distinct, > 1: no 0/1 specialisation, no aliasing


@dataclass(frozen=True)
class Span:
    """Rows `[start, start + size)` of a dim, run padded to `gear` (`size <= gear`)."""

    start: int
    size: int
    gear: int


@dataclass(frozen=True)
class Tiling:
    """Per dim (in the transform's dim order), the spans its raw size is cut into; its chunks
    tile the call."""

    spans: dict[str, tuple[Span, ...]]

    def chunks(self) -> list[Chunk]:
        """Every combination of spans, row-major (the last dim varies fastest)."""
        return [
            dict(zip(self.spans, c, strict=True)) for c in itertools.product(*self.spans.values())
        ]


class Transform:
    """Bindings of one function's inputs and outputs to a profile's dims."""

    def __init__(
        self,
        fn: Callable[..., Any],
        dims: Mapping[str, Dim],
        inputs: Mapping[str, Sequence[str | None]],
        symbols: Mapping[str, str] | None = None,
        outputs: Sequence[Any] | None = None,
    ) -> None:
        self.fn = fn
        self.dims = dict(dims)
        if symbols is None:
            symbols = {s: d for s, d in DEFAULT_SYMBOLS.items() if d in self.dims}
            symbols |= {d: d for d in self.dims}
        for symbol, dim in symbols.items():
            if dim not in self.dims:
                raise ShapeError(f"symbol {symbol!r} maps to unknown dim {dim!r}")
        self.symbols = dict(symbols)
        self.inputs = {n: self._resolve(axes, f"input {n!r}") for n, axes in inputs.items()}
        unbound = set(self.dims) - {d for axes in self.inputs.values() for d in axes}
        if unbound:
            raise ShapeError(f"no input axis carries dim(s) {sorted(unbound)}")
        self.bound = [n for n, axes in self.inputs.items() if any(axes)]
        self.outputs: list[Axes] | None = None  # one Axes per output tensor (pytree leaf)
        if outputs is not None:
            single = all(a is None or isinstance(a, str) for a in outputs)
            declared = [outputs] if single else list(outputs)
            self.outputs = [self._resolve(a, f"outputs[{i}]") for i, a in enumerate(declared)]

    def _resolve(self, axes: Sequence[str | None], what: str) -> Axes:
        for i, a in enumerate(axes):
            if a is not None and a not in self.symbols:
                raise ShapeError(f"{what} axis {i}: unknown symbol {a!r}; known: {self.symbols}")
        return tuple(None if a is None else self.symbols[a] for a in axes)

    def check(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, int]:
        """The raw size of every dim; ShapeError naming the tensor and axis on any mismatch.
        The first call also finds the output axes (symbolic trace) unless declared."""
        if tensors.keys() != self.inputs.keys():
            raise ShapeError(f"expected inputs {sorted(self.inputs)}, got {sorted(tensors)}")
        sizes: dict[str, int] = {}
        for name, axes in self.inputs.items():
            shape = tensors[name].shape
            if len(shape) != len(axes):
                raise ShapeError(f"{name}: expected {len(axes)} axes {axes}, got {tuple(shape)}")
            for axis, dim in enumerate(axes):
                if dim is None:
                    continue
                size = shape[axis]
                if sizes.setdefault(dim, size) != size:
                    first, i = next((n, a.index(dim)) for n, a in self.inputs.items() if dim in a)
                    raise ShapeError(
                        f"{name} axis {axis} ({dim}) is {size}, but {first} axis {i} is"
                        f" {sizes[dim]}"
                    )
                spec = self.dims[dim]
                if not spec.min <= size <= spec.max:
                    raise ShapeError(
                        f"{name} axis {axis}: {dim}={size} is outside [{spec.min}, {spec.max}]"
                    )
        if self.outputs is None:
            self.outputs = self._trace_outputs(tensors)
        return {dim: sizes[dim] for dim in self.dims}

    def tile(
        self, sizes: Mapping[str, int], gears: Mapping[str, Gears] | None = None
    ) -> Tiling | None:
        """The chunks a call of these raw sizes runs as on these gears (sorted tuples; default:
        the dims' initial gears); None means eager."""
        unknown = sizes.keys() - self.dims.keys()
        if unknown:
            raise ShapeError(f"unknown dim(s) {sorted(unknown)}; known: {sorted(self.dims)}")
        spans = {}
        for dim, spec in self.dims.items():
            if dim not in sizes:
                raise ShapeError(f"missing a size for dim {dim}")
            raw = sizes[dim]
            spec.check(dim, raw)
            chunks = chunks_for(gears[dim] if gears else spec.initial_gears, raw, spec.splittable)
            if not chunks:
                return None
            starts = itertools.accumulate(chunks, initial=0)
            spans[dim] = tuple(
                Span(s, min(g, raw - s), g) for s, g in zip(starts, chunks, strict=False)
            )
        return Tiling(spans)

    def fill(
        self, dst: Mapping[str, torch.Tensor], tensors: Mapping[str, torch.Tensor], chunk: Chunk
    ) -> None:
        """Write `chunk`'s rows of every bound input into `dst` (bound axes at least the chunk's
        gears long) and fill the rest of each bound axis with its dim's pad value."""
        for name in self.bound:
            axes, src, out = self.inputs[name], tensors[name], dst[name]
            region = out  # the pads lie outside it, so they may be filled before it is copied
            for axis, dim in enumerate(axes):
                if dim is None:
                    continue
                span = chunk[dim]
                if span.size != src.shape[axis]:  # a chunk of a split call
                    src = src.narrow(axis, span.start, span.size)
                if pad := out.shape[axis] - span.size:
                    region = region.narrow(axis, 0, span.size)
                    out.narrow(axis, span.size, pad).fill_(self.dims[dim].pad_value)
            region.copy_(src)

    def transform(
        self, tensors: Mapping[str, torch.Tensor], chunk: Chunk
    ) -> dict[str, torch.Tensor]:
        """New padded inputs of one chunk; unbound inputs are passed through."""
        out = dict(tensors)
        for name in self.bound:
            t, axes = tensors[name], self.inputs[name]
            out[name] = t.new_empty(
                [n if d is None else chunk[d].gear for d, n in zip(axes, t.shape, strict=True)]
            )
        self.fill(out, tensors, chunk)
        return out

    def leaves(self, outputs: Any) -> tuple[list[torch.Tensor], Any]:
        """`fn`'s outputs as pytree leaves and spec; ShapeError unless the leaves are one tensor
        per output with its axes."""
        leaves, spec = tree_flatten(outputs)
        if len(leaves) != len(self._axes()):
            raise ShapeError(f"fn returned {len(leaves)} tensors, expected {len(self._axes())}")
        for i, (t, axes) in enumerate(zip(leaves, self._axes(), strict=True)):
            if not isinstance(t, torch.Tensor) or t.dim() != len(axes):
                raise ShapeError(f"output {i}: expected a tensor with axes {axes}, got {t!r:.60}")
        return leaves, spec

    def cut(
        self, leaves: Sequence[torch.Tensor], chunk: Chunk, copy: bool = False
    ) -> list[torch.Tensor]:
        """One chunk's output leaves (as `leaves` checked them) sliced back to its rows: views,
        or with `copy` new tensors (the first cut copies, later ones view the copy)."""
        out = []
        for t, axes in zip(leaves, self._axes(), strict=True):
            own = not copy
            for axis, dim in enumerate(axes):
                if dim is not None:
                    size = chunk[dim].size
                    t = t.narrow(axis, 0, size) if own else t.narrow_copy(axis, 0, size)
                    own = True
            out.append(t if own else t.clone())
        return out

    def join(self, parts: Sequence[list[torch.Tensor]], tiling: Tiling) -> list[torch.Tensor]:
        """The cut output leaves of every chunk of `tiling` (in `tiling.chunks()` order),
        concatenated; one chunk's are returned as they are."""
        flat = list(parts)
        for dim, spans in reversed(tiling.spans.items()):
            n = len(spans)
            if n == 1:
                continue
            cat_axes = []
            for i, axes in enumerate(self._axes()):
                if dim not in axes:
                    raise ShapeError(f"output {i} has no {dim} axis: cannot join {n} chunks of it")
                cat_axes.append(axes.index(dim))
            flat = [
                [torch.cat([p[i] for p in flat[k : k + n]], ax) for i, ax in enumerate(cat_axes)]
                for k in range(0, len(flat), n)
            ]
        return flat[0]

    def recover(self, outputs: Sequence[Any], tiling: Tiling) -> Any:
        """Every chunk's raw outputs (in `tiling.chunks()` order) cut back and joined."""
        flat = [self.leaves(o) for o in outputs]
        chunks = tiling.chunks()
        parts = [self.cut(leaves, c) for (leaves, _), c in zip(flat, chunks, strict=True)]
        return tree_unflatten(self.join(parts, tiling), flat[0][1])

    def __call__(
        self, tensors: Mapping[str, torch.Tensor], gears: Mapping[str, Gears] | None = None
    ) -> Any:
        """`fn` run on padded chunks and recovered (eager when the tiling says so)."""
        tiling = self.tile(self.check(tensors), gears)
        if tiling is None:
            return self.fn(**tensors)
        outputs = [self.fn(**self.transform(tensors, c)) for c in tiling.chunks()]
        return self.recover(outputs, tiling)

    def _axes(self) -> list[Axes]:
        assert self.outputs is not None, "check() resolves the output axes first"
        return self.outputs

    def _trace_outputs(self, tensors: Mapping[str, torch.Tensor]) -> list[Axes]:
        """Output axes found by running `fn` on fake tensors whose bound axes are symbols."""
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import (
            DimDynamic,
            ShapeEnv,
            StatelessSymbolicContext,
        )

        env = ShapeEnv()
        mode = FakeTensorMode(shape_env=env, allow_non_fake_inputs=True)
        sizes = {
            d: min(max(s, spec.min), spec.max)
            for (d, spec), s in zip(self.dims.items(), _TRACE_SIZES, strict=False)
        }
        fakes = {}
        for name, axes in self.inputs.items():
            t = tensors[name]
            example = t.new_zeros(
                [n if d is None else sizes[d] for d, n in zip(axes, t.shape, strict=True)]
            )
            dynamic = [DimDynamic.STATIC if d is None else DimDynamic.DYNAMIC for d in axes]
            context = StatelessSymbolicContext(dynamic_sizes=dynamic)
            fakes[name] = mode.from_tensor(example, symbolic_context=context)
        try:
            with mode:
                leaves = tree_flatten(self.fn(**fakes))[0]
        except Exception as e:
            raise ShapeError(
                f"cannot trace the output axes of {self.fn!r} ({e}); declare outputs="
            ) from e
        symbol_dim: dict[Any, str] = {}
        for name, axes in self.inputs.items():
            for axis, dim in enumerate(axes):
                if dim is not None:
                    expr = env.replace(fakes[name].shape[axis].node.expr)
                    if symbol_dim.setdefault(expr, dim) != dim:
                        raise ShapeError(f"{self.fn!r} requires {symbol_dim[expr]} == {dim}")
        found = []
        for i, t in enumerate(leaves):
            if not isinstance(t, torch.Tensor):
                raise ShapeError(f"output {i} of {self.fn!r} is not a tensor: {t!r:.60}")
            axes = []
            for axis, size in enumerate(t.shape):
                expr = env.replace(size.node.expr) if isinstance(size, torch.SymInt) else None
                if expr is not None and expr.free_symbols and expr not in symbol_dim:
                    raise ShapeError(
                        f"output {i} axis {axis} has size {expr}, not one dim's: declare outputs="
                    )
                axes.append(symbol_dim.get(expr))
            found.append(tuple(axes))
        return found
