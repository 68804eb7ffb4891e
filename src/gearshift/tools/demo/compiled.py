"""The demo's compile backend (`--backend compile`): each lane's runner compiles its model (torch).

A `CompiledRunner` here is the compile backend's (`graphs.torchcompile`: each variant its own
static-shape `torch.compile`) of the model's `forward`, its uncounted math: Dynamo would
trace the token counter of `__call__` (a lock and a count). The tokens are counted outside
the compiled code instead: each call of a variant's graph adds its static input's tokens to
the model's count and to this thread's (`here`), and a compile adds one call's (it runs the
function once), so the lanes' figures mean what they do with the eager runner (an eager
chunk, run when no graph is ready, goes uncounted: the demo's arms wait for their gears).
A capture's CPU seconds are its thread's and the children's it waited for meanwhile (the C++
compiler); Inductor compiles in the worker (`compile_threads` 1: no pool of compile processes
whose CPU time no one would see).

`prepare_cache` points a worker at the demo's compile cache: one per demo under its temporary
directory, shared by both arms and every worker through the node's mechanism
(`worker.compile_cache`: the Inductor cache directory and the per-shape locks), so that each
shape is compiled once, cold, and loaded from the cache every other time (FX graph cache hits).
"""

from __future__ import annotations

import os
import resource
import threading
from collections.abc import Callable, Mapping
from typing import Any

import torch

from gearshift.core.dims import Dim, Variant
from gearshift.graphs import torchcompile
from gearshift.graphs.backends import CpuBackend
from gearshift.graphs.pool import GraphResourcePool
from gearshift.tools.demo.arm import Model, Runner, binding, timed
from gearshift.worker import compile_cache


class CompiledRunner(Runner, torchcompile.CompiledRunner):
    """A demo `Runner` whose graphs are static-shape compiles of `model.forward`."""

    def __init__(self, model: Model, dims: Mapping[str, Dim], backend: str,
                 lock_dir: str | None) -> None:
        transform, example = binding(model.forward, model, dims)  # type: ignore[attr-defined]
        super().__init__(transform, example, pool=GraphResourcePool(CpuBackend()),
                         compile_backend=backend, lock_dir=lock_dir)
        self.model, self.tokens = model, 0
        self._local, self._tokens_lock = threading.local(), threading.Lock()

    def here(self) -> int:
        return getattr(self._local, "tokens", 0)

    def computed(self) -> int:
        return self.tokens

    def model_cpu(self) -> float:
        return getattr(self._local, "cpu", 0.0)

    def cpu(self) -> float:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return super().cpu() + children.ru_utime + children.ru_stime

    def _count(self, tokens: int) -> None:
        self._local.tokens = self.here() + tokens
        with self._tokens_lock:
            self.tokens += tokens
            self.model.tokens += tokens

    def _graph_fn(self, gears: Variant, inputs: dict[str, torch.Tensor],
                  lengths: dict[str, torch.Tensor]) -> Callable[[], Any]:
        call = super()._graph_fn(gears, inputs, lengths)  # compiled: it ran once
        tokens = inputs["x"].numel() // self.model.width
        self._count(tokens)

        def counted() -> Any:
            self._count(tokens)
            return timed(self._local, call)

        return counted


def runner_maker(backend: str, lock_dir: str | None
                 ) -> Callable[[Model, Mapping[str, Dim]], CompiledRunner]:
    """`arm.runner_for`'s counterpart: a CompiledRunner of a model on its dims."""
    return lambda model, dims: CompiledRunner(model, dims, backend, lock_dir)


def prepare_cache(namespace: str, directory: str) -> str:
    """Point this process's compiles at the demo's cache in `directory` (its own, never the
    user's: the figures count cold compiles and cache hits of this run); its lock directory."""
    import torch._inductor.config as inductor  # importing it names a cache in the environment

    inductor.compile_threads = 1
    os.environ["XDG_CACHE_HOME"] = directory
    os.environ.pop(compile_cache.CACHE_ENV, None)
    return str(compile_cache.prepare(namespace))
