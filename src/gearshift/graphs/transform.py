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

Output axes come from torch's own symbolic shapes (`padding.trace`, once per
transform, with the bound axes dynamic) unless declared with `outputs=` (no trace
then: the function is never run on fake tensors). An output axis may be exactly
one symbol or static; anything else (`B*S`) must be declared or avoided.

The padding contract (`graphs.padding`): an output that reads an input padded
along a dim yet has no axis of it is refused (PaddingError) on the first call,
unless the function handles that dim's padding: `lengths={"n": "S"}` passes it
the real size of the dim as input `n` (int64, shape (1,): the chunk's, on padded
runs; the caller never passes it), `handles_padding=("S",)` declares that it
already makes the padding harmless. Declared outputs (needed where the trace
cannot run: data-dependent control flow) count as reading every input. Every
input is passed by name: a name the function does not take is refused at
construction.
"""

from __future__ import annotations

import contextlib
import inspect
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from gearshift.core.dims import Dim, Gears, chunks_for
from gearshift.errors import PaddingError, ShapeError
from gearshift.graphs import grad, padding, state
from gearshift.graphs.padding import Axes
from gearshift.graphs.state import StateWrite

Chunk = dict[str, "Span"]
DEFAULT_SYMBOLS = {"B": "BATCHSIZE", "S": "SEQLEN"}


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
        lengths: Mapping[str, str] | None = None,
        handles_padding: Sequence[str] = (),
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
        self.lengths: dict[str, str] = {}  # input -> the dim whose real size it is given
        for name, symbol in (lengths or {}).items():
            if name in self.inputs or not isinstance(symbol, str):
                raise ShapeError(f"lengths[{name!r}] must name a symbol (gearshift passes that"
                                 f" input: it is not one of inputs), got {symbol!r}")
            self._resolve((symbol,), f"lengths[{name!r}]")  # an unknown symbol: ShapeError
            self.lengths[name] = self.symbols[symbol]
        if isinstance(handles_padding, str):
            handles_padding = (handles_padding,)
        self.handled = {*self.lengths.values(), *self._resolve(handles_padding, "handles_padding")}
        self.outputs: list[Axes] | None = None  # one Axes per output tensor (pytree leaf)
        if outputs is not None:
            single = all(a is None or isinstance(a, str) for a in outputs)
            declared = [outputs] if single else list(outputs)
            self.outputs = [self._resolve(a, f"outputs[{i}]") for i, a in enumerate(declared)]
        self._traced = False
        self.inference = False  # the first call ran under torch.inference_mode (`mode`)
        self._checks = tuple(  # per input: its rank and (axis, dim, min, max) of bound axes
            (n, len(axes), tuple((i, d, self.dims[d].min, self.dims[d].max)
                                 for i, d in enumerate(axes) if d is not None))
            for n, axes in self.inputs.items())
        first = list(dict.fromkeys(d for axes in self.inputs.values() for d in axes if d))
        self._in_order = first == list(self.dims)  # check's sizes come in dim order
        self._check_signature()

    def _check_signature(self) -> None:
        """Every input (and lengths input) must be a parameter `fn` takes by name, and every
        parameter it requires must be given: ShapeError naming both sides otherwise."""
        fn = self.fn.forward if isinstance(self.fn, torch.nn.Module) else self.fn
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):  # no signature to read (some builtins): calls tell
            return
        by_name = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        params = sig.parameters.values()
        takes = {p.name for p in params if p.kind in by_name}
        given = [*self.inputs, *self.lengths]
        what = f"{getattr(self.fn, '__qualname__', type(self.fn).__name__)}{sig}"
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            for name in given:
                if name not in takes:
                    raise ShapeError(
                        f"input {name!r} is not a parameter of {what}: inputs are passed by"
                        f" name; rename it to one of {sorted(takes)}"
                    )
        required = [p.name for p in params if p.default is p.empty
                    and p.kind is not inspect.Parameter.VAR_POSITIONAL
                    and p.kind is not inspect.Parameter.VAR_KEYWORD and p.name not in given]
        if required:
            raise ShapeError(f"{what} requires {required}, which no input gives (inputs:"
                             f" {given})")

    def _resolve(self, axes: Sequence[str | None], what: str) -> Axes:
        for i, a in enumerate(axes):
            if a is not None and a not in self.symbols:
                raise ShapeError(f"{what} axis {i}: unknown symbol {a!r}; known: {self.symbols}")
        return tuple(None if a is None else self.symbols[a] for a in axes)

    def check(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, int]:
        """The raw size of every dim; ShapeError naming the tensor and axis on any mismatch
        (`_refuse`). The first call also finds the output axes (symbolic trace) unless
        declared. One pass over the inputs' precomputed bound axes and bounds (`_checks`)."""
        if tensors.keys() != self.inputs.keys():
            self._refuse(tensors)
        sizes: dict[str, int] = {}
        wanting = False  # an input requires grad
        for name, rank, bound in self._checks:
            t = tensors[name]
            if not isinstance(t, torch.Tensor) or t.is_meta or t.dim() != rank:
                self._refuse(tensors)
            wanting = wanting or t.requires_grad
            shape = t.shape
            for axis, dim, low, high in bound:
                size = shape[axis]
                if sizes.setdefault(dim, size) != size or size < low or size > high:
                    self._refuse(tensors)
        if wanting:
            grad.refuse_grad(tensors)
        if not self._traced:
            self.inference = torch.is_inference_mode_enabled()
            self.outputs = self._padding_checked(tensors)
            self._traced = True
        return sizes if self._in_order else {dim: sizes[dim] for dim in self.dims}

    def _refuse(self, tensors: Mapping[str, torch.Tensor]) -> NoReturn:
        """The ShapeError of a call `check` found wrong, naming the tensor and axis."""
        if tensors.keys() != self.inputs.keys():
            raise ShapeError(f"expected inputs {sorted(self.inputs)}, got {sorted(tensors)}")
        sizes: dict[str, int] = {}
        for name, axes in self.inputs.items():
            if not isinstance(tensors[name], torch.Tensor):
                kind = type(tensors[name]).__name__
                raise ShapeError(f"{name} must be a torch.Tensor, got {kind} (convert it first,"
                                 f" e.g. torch.as_tensor)")
            if tensors[name].is_meta:
                raise ShapeError(f"{name} is on the meta device (a shape without data, as a model"
                                 f" built with device='meta' has): gearshift runs fn on real"
                                 f" data; load the weights and pass tensors on a real device")
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
        raise AssertionError("check refused a call _refuse finds right")  # pragma: no cover

    def mode(self) -> contextlib.AbstractContextManager[None]:
        """The grad mode every run of fn is made under, on any thread (`grad.mode`)."""
        return grad.mode(self.inference)

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
        """New padded inputs of one chunk, with its lengths inputs; unbound inputs are passed
        through."""
        out = dict(tensors)
        for name in self.bound:
            t, axes = tensors[name], self.inputs[name]
            out[name] = t.new_empty(
                [n if d is None else chunk[d].gear for d, n in zip(axes, t.shape, strict=True)]
            )
        self.fill(out, tensors, chunk)
        device = tensors[self.bound[0]].device
        return out | self.real({d: s.size for d, s in chunk.items()}, device)

    def real(self, sizes: Mapping[str, int], device: torch.device) -> dict[str, torch.Tensor]:
        """The lengths inputs of a run of these real sizes."""
        return {n: torch.tensor([sizes[d]], device=device) for n, d in self.lengths.items()}

    def call(self, tensors: Mapping[str, torch.Tensor], sizes: Mapping[str, int]) -> Any:
        """`fn` on the unpadded inputs (of these sizes), given its lengths inputs: eager."""
        if not self.lengths:
            return self.fn(**tensors)
        return self.fn(**tensors, **self.real(sizes, tensors[self.bound[0]].device))

    def leaves(self, outputs: Any) -> tuple[list[torch.Tensor], Any]:
        """`fn`'s outputs as pytree leaves and spec; ShapeError unless the leaves are one tensor
        per output with its axes."""
        leaves, spec = tree_flatten(outputs)
        if outputs is None or not all(isinstance(t, torch.Tensor) for t in leaves):
            i, bad = next(((i, t) for i, t in enumerate(leaves)
                           if not isinstance(t, torch.Tensor)), (0, None))
            raise ShapeError(padding.not_tensor(self.fn, i, bad))
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
        sizes = self.check(tensors)
        tiling = self.tile(sizes, gears)
        if tiling is None:
            return self.call(tensors, sizes)
        outputs = [self.fn(**self.transform(tensors, c)) for c in tiling.chunks()]
        return self.recover(outputs, tiling)

    def _axes(self) -> list[Axes]:
        assert self.outputs is not None, "check() resolves the output axes first"
        return self.outputs

    def _padding_checked(self, tensors: Mapping[str, torch.Tensor]) -> list[Axes]:
        """The output axes (declared, else traced on fake tensors whose bound axes are
        symbols); PaddingError if an output reads a padded dim without an axis of it, unless
        `fn` handles that dim's padding."""
        if self.outputs is not None:
            found, reads = self.outputs, [frozenset(self.inputs)] * len(self.outputs)
        else:
            try:
                leaves, shapes = padding.trace(self.fn, self._fakes(tensors))
            except StateWrite as e:
                raise PaddingError(state.written(self.fn, e)) from None
            except padding.NotTensor as e:
                raise ShapeError(padding.not_tensor(self.fn, e.index, e.value)) from None
            except Exception as e:
                raise ShapeError(
                    f"cannot trace the output axes of {self.fn!r} ({e}); declare outputs="
                    " (each output then counts as reading every input)"
                ) from e
            found = padding.axes_of(self.fn, self.inputs, leaves, shapes)
            reads = [leaf.reads for leaf in leaves]
        for i, (axes, read) in enumerate(zip(found, reads, strict=True)):
            for dim in self.dims:
                readers = [n for n in self.inputs if n in read and dim in self.inputs[n]]
                if readers and dim not in axes and dim not in self.handled:
                    symbol = next(s for s, d in self.symbols.items() if d == dim)
                    raise PaddingError(padding.refusal(self.fn, i, dim, readers, symbol))
        return found

    def _fakes(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Fake inputs of the trace (`padding.fakes`), lengths inputs included."""
        return padding.fakes(self.dims, self.inputs, self.lengths, tensors)
