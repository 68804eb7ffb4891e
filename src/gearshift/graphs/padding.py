"""The padding contract: a function run on inputs padded up to a gear, its outputs cut back to
the real rows, must give what it gives on the unpadded inputs; else gearshift refuses it.

- `trace`: the function traced once (make_fx, symbolic) on fake inputs whose bound axes are
  symbols: per output (pytree leaf), its sizes and the inputs it reads (their data or their
  sizes; through views and in-place writes).
- An output that reads an input padded along a dim and has no axis of that dim reduces or
  selects over the padding (the last token, a mean pool): `Transform` refuses it
  (PaddingError) unless the function handles that dim's padding itself (`lengths=`,
  `handles_padding=`).
- `probe` and `mismatch`: random inputs with fewer real rows than a gear, and whether a padded
  run's outputs, cut back, equal the unpadded run's (within the dtype's tolerance). An output
  that keeps the dim may still mix padded rows into real ones (attention over every position,
  a flip): `AdaptiveRunner` checks this at construction and on the first graph of each gear.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
from torch.utils._pytree import tree_flatten

from gearshift.core.dims import Dim
from gearshift.errors import ShapeError
from gearshift.graphs.state import NoStateWrites, reached

Axes = tuple[str | None, ...]  # per tensor axis: the dim it carries, or None (static)
TRACE_SIZES = (3, 5, 7, 11, 13, 17, 19, 23)  # distinct, > 1: no 0/1 specialisation, no aliasing
RTOL = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}
TF32_RTOL = 5e-3  # float32 when matmuls may run in TF32 (a 10-bit mantissa)


class NotTensor(ValueError):
    """Output `index` of the traced function is `value`, not a tensor."""

    def __init__(self, index: int, value: object) -> None:
        super().__init__(f"output {index} is not a tensor: {value!r:.60}")
        self.index, self.value = index, value


def not_tensor(fn: Callable[..., Any], index: int, value: object) -> str:
    """Why `fn`, whose output `index` is `value` (None, a float), cannot run as graphs."""
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    what = "returns None" if value is None else (
        f"returns a {type(value).__name__} as output {index}")
    return (f"{name} {what}: gearshift runs fn as graphs whose outputs are tensors, cut back to"
            f" the real rows, so every output must be a tensor with the padded axes (a Python"
            f" number or None cannot come out of a graph replay). Return tensors (compute a"
            f" scalar from them after the call), or run fn without gearshift")


@dataclass(frozen=True)
class Leaf:
    """One traced output: per axis its size (a sympy expression of the input symbols, or an
    int), and the names of the inputs it reads."""

    sizes: tuple[Any, ...]
    reads: frozenset[str]


def trace(fn: Callable[..., Any], fakes: Mapping[str, torch.Tensor]) -> tuple[list[Leaf], dict]:
    """`fn(**fakes)` traced symbolically (make_fx, in the fakes' mode and shape environment):
    its outputs, and per input its sizes as the trace sees them. Raises what tracing raises
    (data-dependent control flow, an op without a fake kernel; `state.StateWrite`: a write to a
    tensor outside the trace, refused before it happens; NotTensor: a non-tensor output).
    What a node reads is what its inputs read; a tensor written in place (or through a view)
    reads, for every node that aliases it, what the write read (over-approximated: the order
    of reads and writes is ignored)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    names = list(fakes)

    def flat(*args: torch.Tensor) -> Any:
        with NoStateWrites():  # StateWrite before fn writes a tensor outside the trace
            return fn(**dict(zip(names, args, strict=True)))

    graph = make_fx(flat, tracing_mode="symbolic")(*fakes.values()).graph
    reads: dict[torch.fx.Node, frozenset[str]] = {}
    group: dict[torch.fx.Node, torch.fx.Node] = {}  # union-find of aliasing nodes
    written: dict[torch.fx.Node, frozenset[str]] = {}  # per group root: what writes read

    def root(n: torch.fx.Node) -> torch.fx.Node:
        while group.get(n, n) is not n:
            n = group[n]
        return n

    shapes: dict[str, tuple[Any, ...]] = {}
    placeholders = iter(names)
    output: Any = None
    for node in graph.nodes:
        if node.op == "placeholder":
            name = next(placeholders)
            reads[node] = frozenset((name,))
            shapes[name] = _sizes(node.meta["val"])
        elif node.op == "output":
            output = node.args[0]
        else:
            reads[node] = frozenset().union(*(reads[n] for n in node.all_input_nodes))
            for arg, is_write in _aliased(node):
                group[root(node)] = r = root(arg)
                if is_write:
                    written[r] = written.get(r, frozenset()) | reads[node]
    leaves = []
    for i, node in enumerate(tree_flatten(output)[0]):
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else node
        if not isinstance(val, torch.Tensor):
            raise NotTensor(i, val)
        leaves.append(Leaf(_sizes(val), reads[node] | written.get(root(node), frozenset())))
    return leaves, shapes


def fakes(dims: Mapping[str, Dim], inputs: Mapping[str, Axes], lengths: Mapping[str, str],
          tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Fake inputs for `trace` in a new symbolic shape environment, shaped as `tensors`: each
    bound axis a symbol (sizes distinct per dim), and each lengths input (name -> dim) an
    int64 tensor of shape (1,) on the first bound input's device."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import (
        DimDynamic,
        ShapeEnv,
        StatelessSymbolicContext,
    )

    mode = FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True)
    sizes = {d: min(max(s, spec.min), spec.max)
             for (d, spec), s in zip(dims.items(), TRACE_SIZES, strict=False)}
    out = {}
    for name, axes in inputs.items():
        t = tensors[name]
        example = t.new_zeros(
            [n if d is None else sizes[d] for d, n in zip(axes, t.shape, strict=True)])
        dynamic = [DimDynamic.STATIC if d is None else DimDynamic.DYNAMIC for d in axes]
        context = StatelessSymbolicContext(dynamic_sizes=dynamic)
        out[name] = mode.from_tensor(example, symbolic_context=context)
    device = next(tensors[n].device for n, axes in inputs.items() if any(axes))
    static = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.STATIC])
    for name, dim in lengths.items():
        size = torch.tensor([sizes[dim]], device=device)
        out[name] = mode.from_tensor(size, symbolic_context=static)
    return out


def axes_of(fn: Callable[..., Any], inputs: Mapping[str, Axes], leaves: Sequence[Leaf],
            shapes: Mapping[str, tuple]) -> list[Axes]:
    """Each traced output's axes (`inputs`: each input's dims): the dim whose symbol its size
    is, or None (static); ShapeError for a size of no one dim."""
    symbol_dim: dict[Any, str] = {}
    for name, axes in inputs.items():
        for axis, dim in enumerate(axes):
            expr = shapes[name][axis]
            if (dim is not None and expr.free_symbols
                    and symbol_dim.setdefault(expr, dim) != dim):
                raise ShapeError(f"{fn!r} requires {symbol_dim[expr]} == {dim}")
    found = []
    for i, leaf in enumerate(leaves):
        for axis, expr in enumerate(leaf.sizes):
            if expr.free_symbols and expr not in symbol_dim:
                raise ShapeError(
                    f"output {i} axis {axis} has size {expr}, not one dim's: declare outputs="
                )
        found.append(tuple(symbol_dim.get(e) for e in leaf.sizes))
    return found


def _aliased(node: torch.fx.Node) -> list[tuple[torch.fx.Node, bool]]:
    """The arguments `node`'s result may alias (views, in-place ops, a getitem of a multi-output
    op), each with whether the op writes it."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return [(n, False) for n in node.all_input_nodes] if node.op == "call_function" else []
    out = []
    for i, arg in enumerate(schema.arguments):
        value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
        if arg.alias_info is not None and isinstance(value, torch.fx.Node):
            out.append((value, bool(arg.alias_info.is_write)))
    return out


def _sizes(t: torch.Tensor) -> tuple[Any, ...]:
    return tuple(
        s.node.shape_env.replace(s.node.expr) if isinstance(s, torch.SymInt) else sympy.Integer(s)
        for s in t.shape
    )


def refusal(fn: Callable[..., Any], i: int, dim: str, readers: Sequence[str],
            symbol: str) -> str:
    """Why output `i` is refused: it reads `readers` (padded along `dim`, bound by `symbol`)
    without an axis of `dim`; and what to do."""
    name = getattr(fn, "__qualname__", None) or repr(fn)
    return (
        f"output {i} of {name} has no {dim} axis, yet it reads {', '.join(readers)}, padded"
        f" along {dim}: it reduces or selects over the padded rows (the last row, a mean, a"
        f" sum), so its result would change with the padding. Return per-row outputs (keep"
        f" the {dim} axis) and select after run(); or pass the real length in:"
        f" lengths={{'n': {symbol!r}}} gives fn an input `n`, the real {dim} as an int64"
        f" tensor of shape (1,), to read (e.g. `m(x)[n - 1]`, `(y * mask).sum(0) / n`); or"
        f" declare handles_padding=({symbol!r},) when fn already makes its padding harmless"
        f" (a mask it reads, a pad value neutral to its reduction)"
    )


def changed(fn: Callable[..., Any], real: Mapping[str, int], gears: Mapping[str, int],
            diff: str) -> str:
    """Why `fn` is refused when a padded probe (`real` rows padded to `gears`) gave `diff`."""
    name = getattr(fn, "__qualname__", None) or repr(fn)
    return (
        f"{name} run on inputs padded from {dict(real)} to gears {dict(gears)} does not give,"
        f" cut back, what it gives on the unpadded inputs ({diff}): the padding changes its"
        f" real rows (attention over every position, a reduction or a flip over the padded"
        f" axis). Make fn leave padded rows out (a mask or a lengths= input it reads, causal"
        f" attention), or run it without gearshift"
    )


def unsplit(fn: Callable[..., Any], sizes: Mapping[str, int], gears: Mapping[str, int],
            diff: str) -> str:
    """Why `fn` is refused when a call of `sizes`, split into chunks of `gears`, gave `diff`."""
    name = getattr(fn, "__qualname__", None) or repr(fn)
    dims = ", ".join(sorted(sizes))
    return (
        f"{name} run on {dict(sizes)} split into chunks of {dict(gears)} does not give, joined,"
        f" what it gives unsplit ({diff}): a chunk does not see the other chunks' rows, and fn"
        f" mixes rows along {dims} (causal attention reads every earlier position). Declare"
        f" Dim(splittable=False) for {dims} (a call over the largest gear then runs eagerly,"
        f" unsplit, until a larger gear is added), or run fn without gearshift"
    )


def unstable(fn: Callable[..., Any], diff: str) -> str:
    """Why `fn` is refused when two runs of it on the same inputs gave `diff`."""
    name = getattr(fn, "__qualname__", None) or repr(fn)
    train = [m for m in _modules(fn) if m.training]
    hint = (f"{type(train[0]).__name__} is in train mode (dropout, batch statistics): call"
            f" .eval() on the model" if train else
            "a random op (dropout, sampling) on the default generator")
    return (
        f"{name} gives different results on the same inputs ({diff}): {hint}. gearshift checks"
        f" a padded run against an unpadded one and replays graphs of it, so fn must be"
        f" deterministic; make it so, or run it without gearshift"
    )


def _modules(fn: Callable[..., Any]) -> list[torch.nn.Module]:
    """The modules `fn` is or reaches directly (`state.reached`)."""
    return [v for _, v in reached(fn) if isinstance(v, torch.nn.Module)]


def probe_size(dim: Dim, gear: int) -> int:
    """The real size a gear is checked with: about half of it (so that it is padded), at
    least the dim's min, at most the gear."""
    return min(gear, max(dim.min, gear // 2))


def probe(
    example: Mapping[str, torch.Tensor], inputs: Mapping[str, Axes], sizes: Mapping[str, int],
    seed: int = 0,
) -> dict[str, torch.Tensor]:
    """Inputs of these dim sizes shaped and typed as `example`: random floats on bound
    inputs, integers drawn from the example's own values (token ids stay valid), unbound
    inputs as the example's."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in example.items():
        axes = inputs[name]
        if not any(axes):
            out[name] = t.clone()
            continue
        shape = [n if d is None else sizes[d] for d, n in zip(axes, t.shape, strict=True)]
        if t.is_floating_point() or t.is_complex():
            v = torch.randn(shape, generator=g).to(t.dtype)
        elif t.dtype == torch.bool:
            v = torch.rand(shape, generator=g) < 0.5
        else:
            values = t.detach().flatten().cpu()
            v = (values[torch.randint(values.numel(), shape, generator=g)] if values.numel()
                 else torch.zeros(shape, dtype=t.dtype))
        out[name] = v.to(t.device)
    return out


def mismatch(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor]) -> str | None:
    """How a padded run's outputs (cut back) differ from the unpadded run's, or None when they
    agree: integers exactly, floats within the dtype's relative tolerance (of the largest
    magnitude of the output)."""
    if len(got) != len(want):
        return f"{len(got)} outputs padded, {len(want)} unpadded"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g.shape != w.shape or g.dtype != w.dtype:
            return (f"output {i} is {tuple(g.shape)} {g.dtype} padded, {tuple(w.shape)}"
                    f" {w.dtype} unpadded")
        g, w = g.detach(), w.detach().to(g.device)
        if not (g.is_floating_point() or g.is_complex()):
            if not torch.equal(g, w):
                return f"output {i} differs in {int((g != w).sum())} of {g.numel()} elements"
            continue
        wide = torch.complex128 if g.is_complex() else torch.float64
        same = (g == w) | (g.isnan() & w.isnan())
        diff = torch.where(same, 0.0, (g.to(wide) - w.to(wide)).abs())
        finite = w[w.isfinite()].abs()
        scale = float(finite.max()) if finite.numel() else 0.0
        err = float(diff.nan_to_num(nan=float("inf")).max()) if diff.numel() else 0.0
        if err > _rtol(g.dtype) * max(scale, 1e-3):
            return f"output {i} differs by up to {err:.3g} (its largest magnitude: {scale:.3g})"
    return None


def _rtol(dtype: torch.dtype) -> float:
    if dtype == torch.float32 and (torch.backends.cuda.matmul.allow_tf32
                                   or torch.get_float32_matmul_precision() != "highest"):
        return TF32_RTOL
    return RTOL.get(dtype, RTOL[torch.float32])
