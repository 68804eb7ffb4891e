"""The adaptive runner: graphs of one function per gear combination, on gears that change.

A variant is one gear per dim (in the transform's dim order), captured as one graph whose inputs are
views of the leading rows of static buffers shared by all variants. The buffers are sized by the
largest gears; a capture beyond them allocates larger ones for the variants captured from then on
(older variants keep theirs until released). A release after which the variants left and the current
gears need smaller buffers marks them for re-staging: the next `capture` call (the warm-up thread)
allocates the smaller buffers and recaptures the survivors on them one at a time, each swapped in
and its old graph released at once, so the old buffers go with the last of them. A graph is tracked
in one place, its variant's `Captured` in `_variants` (copy-on-write under `_lock`), with the key
the device's GraphResourcePool released it by.

The request path never captures: it runs the chunks of its `Route` (`core.dims`, as the profile's
router found them; one lookup), a chunk whose variant is not ready on the smallest ready variant
that covers it, else eagerly, its variant remembered as wanted (at most MAX_WANTED; `on_want` is
called when one is first wanted) until the warm-up thread takes them (`take_wanted`). Replays are
serialised (the variants share the buffers and their outputs) under `_lock`, inside the capture
window (`graphs.window`); eager chunks run outside both. Every input must have the example's dtype
(a graph cannot return another). Captures run on the caller's thread, meant to be a warm-up thread;
a failed one leaves nothing behind (its graph is reset) and is counted. Every graph captured is
measured there (`graphs.measure`) before any request replays it, its cost kept (bounded) for
`take_measurements`; `buffer_bytes` gives the static buffers' bytes.

The padding contract (`graphs.padding`, `graphs.probe`): beyond the transform's refusals, a random
probe of about half a gear's rows, padded, must give what it gives unpadded: run eagerly at
construction (PaddingError), and replayed on the first graph of each gear (on the cpu, where a
capture runs the function once, that run is on the probe: `folds_probe`). A graph that fails is
dropped and every call runs eagerly, unpadded, from then on (`refused`, logged once). Lengths inputs
(`lengths=`) are buffers of each graph, set to a chunk's real sizes.
"""

from __future__ import annotations

import functools
import logging
import math
import operator
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import is_inference_mode_enabled
from torch.utils._pytree import tree_unflatten

from gearshift.clock import Clock
from gearshift.core.dims import Gears, Route, Variant, gear_for
from gearshift.errors import ShapeError
from gearshift.graphs import forks, plans, spans
from gearshift.graphs.backends import backend_for
from gearshift.graphs.buffers import StaticBuffers
from gearshift.graphs.capturing import Captured, Capturing
from gearshift.graphs.device import GUARD
from gearshift.graphs.measure import GraphCost, Meter, replays_for
from gearshift.graphs.pool import GraphResourcePool
from gearshift.graphs.probe import Prober
from gearshift.graphs.transform import Tiling, Transform

log = logging.getLogger(__name__)
MAX_WANTED = 4096  # variants wanted by requests kept until taken (once full, no more kept)


class AdaptiveRunner(Capturing):
    """Graphs of one transform's function, one per captured variant.

    `gears` (dim -> sorted gears) is what calls are tiled on; replace it whole
    to adopt a new gear set. `stats`: replays, eager (calls or chunks), captures, capture
    failures (`meter.failures`: graphs left unmeasured). `pool` (default: the device's) gives
    the backend; `clock` times the measurements, `replays` of each graph timed (default: the
    backend's, `measure.replays_for`; 0: none measured).
    """

    def __init__(
        self,
        transform: Transform,
        example: Mapping[str, torch.Tensor],
        pool: GraphResourcePool | None = None,
        clock: Clock | None = None,
        replays: int | None = None,
    ) -> None:
        transform.check(example)
        self.transform = transform
        self.names = tuple(transform.dims)
        self.device = next(iter(example.values())).device
        if pool is None:
            backend = backend_for(self.device)
            pool = GraphResourcePool.get_pool(backend.index, backend.kind)
        self.pool, self.backend = pool, pool.backend
        self.gears: dict[str, Gears] = {d: s.initial_gears for d, s in transform.dims.items()}
        self.stats = {"replays": 0, "eager": 0, "captures": 0, "capture_failures": 0}
        self.meter = Meter(self.backend, clock,
                           replays_for(self.backend) if replays is None else replays)
        self._wanted: dict[Variant, None] = {}  # written by request threads, swapped by take
        self.on_want: Callable[[], None] | None = None  # a variant first wanted (a profile's wake)
        self._unbound = {
            n: example[n].clone() for n in transform.inputs if n not in transform.bound
        }
        self.refused: str | None = None  # why padding was given up (all calls eager since)
        self._prober = Prober(transform, example)
        self._staged = StaticBuffers(transform, example,
                                     tuple(g[-1] for g in self.gears.values()), self.device)
        self._variants: dict[Variant, Captured] = {}  # copy-on-write, under _lock
        self._lock = threading.Lock()  # replays: the buffers, the graphs' outputs
        self._count_lock = threading.Lock()  # eager counts, outside `_lock`
        self._capture_lock = threading.Lock()
        self._spans = spans.OneChunk(self.names)  # the chunk of each one-chunk call
        self._plans = plans.Plans()  # its copies on a ready variant, under `_lock`
        # a replay's section: the capture window, `_lock`, the device's order of streams
        self._section = GUARD.holding(self._lock, getattr(self.backend, "order", None))
        self._restage = False  # the survivors of a release need smaller buffers
        self._prober.check_eagerly(self.gears)
        forks.track(self)

    def _forked(self) -> None:
        """In a forked child (`graphs.forks`): fresh locks (a parent's thread may hold them)."""
        self._lock, self._count_lock = threading.Lock(), threading.Lock()
        self._capture_lock = threading.Lock()
        self._section = GUARD.holding(self._lock, getattr(self.backend, "order", None))

    def ready(self) -> list[Variant]:
        return sorted(self._variants)

    def room(self) -> tuple[int | None, str]:
        """How many more graphs its pool may hold, and why (`GraphResourcePool.room`)."""
        return self.pool.room()

    def capture(self, variants: Iterable[Mapping[str, int]]) -> int:
        """Capture the given variants (dim -> gear) that are not ready, largest first; returns
        how many were captured. For the warm-up thread, never the request path. GraphLimit
        when the pool is full; a failed capture is counted and raised (nothing is kept); a
        graph that fails the padding check is dropped, and none is captured after it. Under
        the transform's grad mode (`Transform.mode`), whatever the calling thread's."""
        with self.transform.mode():
            return self._capture_all(variants)

    def _capture_all(self, variants: Iterable[Mapping[str, int]]) -> int:
        todo = {self._variant(v) for v in variants} - self._variants.keys()
        if self._restage:
            with self._capture_lock:
                self._restage_now()
        done = 0
        for gears in sorted(todo, key=lambda g: (math.prod(g), g), reverse=True):
            with self._capture_lock:
                if self.refused is not None:
                    break
                if gears in self._variants:
                    continue
                self.pool.admit()
                captured = self._capture(gears)
                if captured is None:
                    break
                with self._lock:
                    self._variants = {**self._variants, gears: captured}
                    self._plans.clear()  # none keeps an old capture's buffers alive
                    self.stats["captures"] += 1
                done += 1
        return done

    def take_measurements(self) -> list[tuple[dict[str, int], GraphCost]]:
        """The costs of the graphs captured since the last call, oldest first (per graph:
        its variant, dim -> gear; `Meter.take`)."""
        return self.meter.take()

    def buffer_bytes(self) -> dict[str, tuple[int, int, int]]:
        """The static buffers the graphs captured from now on read, per dim: the gear they are
        sized at, their bytes, and the bytes of those with an axis on the dim
        (`StaticBuffers.footprint`)."""
        return self._staged.footprint()

    def take_wanted(self) -> list[Variant]:
        """The variants (gears in dim order, as `ready`) that chunks wanted and found not ready
        since the last call, first wanted first; some may be ready by now."""
        wanted, self._wanted = self._wanted, {}
        return list(wanted.copy())  # one C call: a request may still be adding to it

    def run(self, tensors: Mapping[str, torch.Tensor], sizes: Mapping[str, int] | None = None,
            route: Route | None = None) -> Any:
        """`fn(**tensors)`, computed by replaying graphs on padded chunks where possible.
        `sizes`: `transform.check(tensors)` when the caller has checked them. `route`: the
        chunks to run, as a router found them (`Profile.run`; or another process's router of
        the same profile); without one, the chunks of `sizes` on `gears`. A call of one chunk
        per dim (`route.variant`) whose graph is ready, the common case, is one lookup under
        the lock, its plan's copies in (`graphs.plans`), one replay and its copies out, in the
        caller's grad mode when its inference mode is the transform's (nothing to record: the
        graph's outputs require no grad, nor may inputs while grad is on, `grad.refuse_grad`);
        every other call under the transform's grad mode (`Transform.mode`: no grad_fn)."""
        t = self.transform
        sizes = t.check(tensors) if sizes is None else sizes
        self._staged.check(tensors)
        variant = self._variant_of(sizes) if route is None else route.variant
        if (variant is not None and self.refused is None
                and t.inference == is_inference_mode_enabled()):
            at = (variant, tuple(map(sizes.__getitem__, self.names)))
            with self._section:  # the capture window, the lock, the device's order
                captured = self._variants.get(variant)
                if captured is not None:
                    plan = self._plans.get(at)
                    if plan is None or plan.captured is not captured:
                        plan = self._plans.keep(at, plans.plan(t, captured, self._spans[at],
                                                               self._unbound))
                    for view, value in plan.pads:
                        view.fill_(value)
                    for name, view in plan.into:
                        view.copy_(tensors[name])
                    for view, size in plan.lengths:
                        view.fill_(size)
                    captured.graph.replay()
                    self.stats["replays"] += 1
                    if plan.alone:
                        return plan.out[0].clone()
                    return tree_unflatten([v.clone() for v in plan.out], captured.spec)
        with t.mode():
            return self._run_other(tensors, sizes, variant, route)

    def _run_other(self, tensors: Mapping[str, torch.Tensor], sizes: Mapping[str, int],
                   variant: Variant | None, route: Route | None) -> Any:
        """`run`'s other calls, under the transform's grad mode: eager, or `_run_tiles`."""
        t = self.transform
        if self.refused is not None:
            self._count_eager()
            return t.call(tensors, sizes)
        if variant is not None:
            chunk = self._spans[(variant, tuple(map(sizes.__getitem__, self.names)))]
            tiling: Tiling | None = Tiling({d: (s,) for d, s in chunk.items()})
        elif route is None:
            tiling = t.tile(sizes, self.gears)
        else:
            tiling = spans.tiling(route.chunks, sizes)
        if tiling is None:
            self._count_eager()
            return t.call(tensors, sizes)
        return self._run_tiles(tensors, tiling)

    def _variant_of(self, sizes: Mapping[str, int]) -> Variant | None:
        """The variant of a call of `sizes` on `gears` when it is one chunk per dim, else None."""
        current = self.gears  # read once: it may be replaced meanwhile
        gears = tuple(gear_for(current[d], sizes[d]) for d in self.names)
        return None if None in gears else gears  # type: ignore[return-value]

    def _run_tiles(self, tensors: Mapping[str, torch.Tensor], tiling: Tiling) -> Any:
        """`fn(**tensors)` chunk by chunk: replayed on the ready graph that covers each (its
        own, else the smallest larger), else eagerly; the outputs joined."""
        t = self.transform
        chunks = [(c, tuple(c[d].gear for d in self.names)) for c in tiling.chunks()]
        parts: list[Any] = [None] * len(chunks)
        ready = [self._ready(variant, want=True) is not None for _, variant in chunks]
        if any(ready):  # the capture window before the lock (a thread in it may run this)
            with self._section:
                self._load_unbound(tensors)
                for i, (chunk, variant) in enumerate(chunks):
                    captured = self._ready(variant) if ready[i] else None
                    if captured is not None:  # else it went meanwhile
                        self.stats["replays"] += 1
                        parts[i] = plans.replay(t, captured, tensors, chunk), captured.spec
        for i, (chunk, _) in enumerate(chunks):
            if parts[i] is None:  # no graph covers it (or it went meanwhile): outside the lock
                self._count_eager()
                leaves, spec = t.leaves(t.fn(**t.transform(tensors, chunk)))
                parts[i] = t.cut(leaves, chunk), spec
        leaves = t.join([p for p, _ in parts], tiling)
        return tree_unflatten(leaves, parts[0][1])

    def _count_eager(self) -> None:
        with self._count_lock:
            self.stats["eager"] += 1

    def forget_probes(self) -> None:
        """Probe every gear's graph again, as a new runner would (a group's ranks recapturing
        together must run the same probes, collectives included)."""
        self._prober.checked = {d: set() for d in self._prober.names}

    def release(self, dim: str, gear: int) -> int:
        """Drop every variant that used `gear` on `dim` and release its graphs through the pool
        (the caller has let requests on it finish); returns how many graphs were released."""
        if dim not in self.names:
            raise ShapeError(f"unknown dim {dim!r}; known: {list(self.names)}")
        i = self.names.index(dim)
        with self._lock:
            gone = [c.key for g, c in self._variants.items() if g[i] == gear]
            self._variants = {g: c for g, c in self._variants.items() if g[i] != gear}
            self._plans.clear()
        released = self.pool.remove_by_keys(gone)
        if any(map(operator.lt, self._needed(), self._staged.caps)):
            self._restage = True
        return released

    def _needed(self) -> Variant:
        """The buffer sizes the ready variants and the current gears need."""
        sizes = [*self._variants, tuple(self.gears[d][-1] for d in self.names)]
        return tuple(max(g[i] for g in sizes) for i in range(len(self.names)))

    def _restage_now(self) -> None:
        """Smaller buffers, and every ready variant recaptured on them in turn (under
        `_capture_lock`): each is swapped in, then its old graph released; a failure leaves
        the rest on the old buffers (consistent; they go when those variants do)."""
        self._restage = False
        needed = self._needed()
        if not any(map(operator.lt, needed, self._staged.caps)):
            return
        self._staged.resize(tuple(map(min, needed, self._staged.caps)))
        for gears in sorted(self._variants, key=lambda g: (math.prod(g), g), reverse=True):
            old = self._variants[gears].key
            captured = self._capture(gears)
            if captured is None:  # refused by the padding probe: every call runs eagerly
                break
            with self._lock:
                self._variants = {**self._variants, gears: captured}
                self._plans.clear()
                self.stats["captures"] += 1
            self.pool.remove_by_keys([old])

    def _ready(self, gears: Variant, want: bool = False) -> Captured | None:
        """The graph of `gears`, else of the smallest ready variant covering it, else None;
        `want`: remember `gears` as wanted when it is not ready itself (the request path)."""
        variants = self._variants
        if gears in variants:
            return variants[gears]
        if want and gears not in (wanted := self._wanted) and len(wanted) < MAX_WANTED:
            wanted[gears] = None
            if self.on_want is not None:
                self.on_want()
        covering = [g for g in variants if all(map(operator.ge, g, gears))]
        best = min(covering, key=lambda g: (math.prod(g), g), default=None)
        return None if best is None else variants[best]

    def _variant(self, gears: Mapping[str, int]) -> Variant:
        if gears.keys() != set(self.names):
            raise ShapeError(f"a variant needs one gear per dim {list(self.names)}, got {gears}")
        for dim, gear in gears.items():
            self.transform.dims[dim].check(dim, gear)
        return tuple(int(gears[d]) for d in self.names)

    def _graph_fn(self, gears: Variant, inputs: dict[str, torch.Tensor],
                  lengths: dict[str, torch.Tensor]) -> Callable[[], Any]:
        """What the graph of `gears` records: `fn` on the static views `inputs`, the unbound
        inputs' buffers and `lengths` (a subclass may prepare more, e.g. compile it; that time
        counts as the capture's). One partial: a cpu graph calls it at each replay."""
        return functools.partial(self.transform.fn, **inputs, **self._unbound, **lengths)
