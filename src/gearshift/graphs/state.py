"""State a function keeps outside its inputs: refused, since gearshift runs it besides the
caller's calls.

gearshift runs `fn` on data of its own: the symbolic trace (`graphs.padding.trace`), the
padding probes, each graph's compile, warm-up and capture, and its measuring replays; and a
graph runs it on padded rows. A function that writes a tensor which is neither its input nor
its output (a static KV cache held outside it, a counter tensor, a BatchNorm's running
statistics in train mode) would find that tensor changed by those runs. So the trace runs
`fn` under `NoStateWrites`, a dispatch mode that sees every op before it runs: an op that
writes (in place, through a view, or `out=`) a real tensor, one that is not the trace's (its
inputs and whatever `fn` makes are fake there) or a view of one, raises StateWrite before the
write happens,
so the trace leaves the tensor as it was; the transform refuses `fn` (PaddingError) with
`written`'s message. Writes to its own inputs are allowed (gearshift passes copies).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode


class StateWrite(Exception):
    """`fn` wrote `tensor` (a real one: neither an input nor its own) during the trace."""

    def __init__(self, op: str, tensor: torch.Tensor) -> None:
        super().__init__(op)
        self.op, self.tensor = op, tensor


# ops whose real argument fn has just made (`torch.tensor(...)` in fn: a constant lifted
# into the trace): their result is fn's own
_FRESH = frozenset({torch.ops.aten.lift_fresh.default})


class NoStateWrites(TorchDispatchMode):
    """Raises StateWrite at the first op that would write a real (non-fake) tensor or a view
    of one (a real tensor sliced by a symbolic size is a fake view of it)."""

    def __init__(self) -> None:
        super().__init__()
        self._bases: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # view id: view, real

    def _real(self, t: object) -> torch.Tensor | None:
        """The real tensor `t` is or views, if any."""
        if not isinstance(t, torch.Tensor):
            return None
        if not isinstance(t, FakeTensor):
            return t
        held = self._bases.get(id(t))
        return held[1] if held is not None and held[0] is t else None

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        schema = getattr(func, "_schema", None)
        viewed = None
        for i, arg in enumerate(schema.arguments if schema is not None else ()):
            if arg.alias_info is None:
                continue
            value = args[i] if i < len(args) else kwargs.get(arg.name)
            for t in value if isinstance(value, (list, tuple)) else (value,):
                real = self._real(t)
                if real is not None and arg.alias_info.is_write:
                    raise StateWrite(str(func), real)
                viewed = viewed if real is None else real
        out = func(*args, **kwargs)
        if viewed is not None and func not in _FRESH:  # a view of a real tensor: a write
            for t in out if isinstance(out, (list, tuple)) else (out,):
                if isinstance(t, FakeTensor):  # to it is a write to that
                    self._bases[id(t)] = (t, viewed)
        return out


def written(fn: Callable[..., Any], error: StateWrite) -> str:
    """Why `fn` is refused: it writes `error.tensor`, named where it can be found."""
    t = error.tensor
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    found, owner = _name_of(fn, t)
    what = found or f"a {t.dtype} tensor of shape {tuple(t.shape)}"
    train = (" (a model in train mode updates its statistics: call model.eval())"
             if owner is not None and owner.training else "")
    return (
        f"{name} writes {what} ({error.op}), which is neither one of its inputs nor its output:"
        f" state kept outside the function{train}. gearshift runs fn besides your calls (its"
        f" trace, padding probes, compiles, warm-ups and measuring replays, on data of its"
        f" own) and its graphs run it on padded rows, so that state would be overwritten."
        f" Return the new state as an output and write it after the call (e.g. the step's new"
        f" key and value rows, written into your cache by you), or run fn without gearshift"
    )


Owner = torch.nn.Module | None


def _name_of(fn: Callable[..., Any], t: torch.Tensor) -> tuple[str | None, Owner]:
    """The name `fn` reaches `t` (or a tensor sharing its storage) by, and the module holding
    it, if any."""
    try:
        ptr = t.untyped_storage().data_ptr()
        for name, value, owner in _reachable(fn):
            if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() == ptr:
                return name, owner
    except Exception:  # a courtesy: the message says the shape otherwise
        pass
    return None, None


def reached(fn: Any) -> list[tuple[str, Any]]:
    """What `fn` reaches directly, by name: itself if it is not a plain function, else its
    closure and the globals it names."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return [("", fn)]
    cells = getattr(fn, "__closure__", None) or ()
    values = [(n, c.cell_contents) for n, c in zip(code.co_freevars, cells, strict=False)
              if _full(c)]
    names = getattr(fn, "__globals__", {})
    return values + [(n, names[n]) for n in code.co_names if n in names]


def _reachable(fn: Any) -> Iterator[tuple[str, Any, Owner]]:
    """The tensors `fn` reaches (`reached`; a module among them: its parameters and buffers,
    with the module holding each)."""
    for name, value in reached(fn):
        if isinstance(value, torch.nn.Module):
            for prefix, module in value.named_modules(prefix=name):
                tensors = [*module.named_parameters(recurse=False),
                           *module.named_buffers(recurse=False)]
                for n, v in tensors:
                    yield ".".join(p for p in (prefix, n) if p), v, module
        else:
            yield name, value, None


def _full(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:
        return False
    return True
