"""Where a device graph's cuBLAS workspace lives, and the order of the kernels that share one.

cuBLAS keeps one workspace per (handle, stream), a handle being a thread's, made on first use
from the current pool (`aten/src/ATen/cuda/CublasHandlePool.cpp`, `setWorkspaceForHandle`:
`CUBLAS_WORKSPACE_CONFIG`, 32 MiB on sm90, by `parseChosenWorkspaceSize`); a capture records
the workspace's address into its kernels; `CUDAGraph::reset` frees its capture stream's
(`clearCublasWorkspacesForStream`, pytorch PR #175276) and `_cuda_clearCublasWorkspaces` (any
caller: Inductor's `clear_cublas_manager`, user code) frees every one. A replay through a freed
workspace whose memory someone else took is a wrong result or an illegal address.

Two designs, chosen by what the running torch offers (`Workspaces.design`):

- "kept" (torch.cuda `MemPool`, `use_mem_pool` and `current_blas_handle` present): before each
  recording, the capturing thread's workspace on the capture stream is made, if it is gone,
  inside a pool of the backend's own (`prime`: `current_blas_handle()` allocates it without a
  kernel; the cuda backend's primer also runs one tiny bias GEMM, which makes the cuBLASLt
  workspace). That pool is never freed while the backend lives and only priming allocates from
  it, so a workspace freed by a reset or anyone's clear stays the graphs' (re-primed into the
  same block: the pool holds nothing else of its size). Graphs' pools then hold their
  activations only; the backend holds one workspace per capturing thread, once. Every kernel
  through it (replays, the primer) runs in one order across streams (`Order`).
- "per_graph" (the fallback): the process's workspaces are cleared before the warm-ups, before
  and after each recording, so that each graph records with a workspace made in its own pool
  (a workspace's bytes in every graph), and no reset frees what another recorded with.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

KEPT, PER_GRAPH = "kept", "per_graph"
_NOTHING = contextlib.nullcontext()  # reentrant and stateless: one for every caller


def ordered(backend: Any) -> contextlib.AbstractContextManager[None]:
    """`backend.order.inside()` where the backend orders its streams (`Order`: a device's),
    else a block of no order (the cpu backend's one stream)."""
    order = getattr(backend, "order", None)
    return _NOTHING if order is None else order.inside()


class Order:
    """Kernels of several streams in one order: a block run `inside()` starts (on the caller's
    current stream) after every block before it, whatever stream ran that one (an event
    recorded at each block's end, waited for at the next one's start)."""

    def __init__(self, module: Any, index: int) -> None:
        self.module, self.index = module, index
        self._lock = threading.RLock()
        self._depth = 0
        self._last: Any = None

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """Re-entrant: a block inside another one on this thread is part of it."""
        with self._lock:
            self._depth += 1
            stream = self.module.current_stream(self.index)
            if self._depth == 1 and self._last is not None:
                stream.wait_event(self._last)
            try:
                yield
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self._last = stream.record_event()


class Workspaces:
    """One backend's workspace design (see the module): `design`, and what a capture does
    before its warm-ups (`before_warmups`), before and after its recording."""

    def __init__(self, api: Any, index: int, order: Order) -> None:
        self.api, self.index, self.order = api, index, order
        kept = None not in (api.mem_pool, api.use_mem_pool, api.prime_workspace)
        self.design = KEPT if kept else PER_GRAPH
        self.pool: Any = None  # the kept workspaces' pool, made at the first recording

    def clear(self) -> None:
        if self.api.clear_workspaces is not None:
            self.api.clear_workspaces()

    def before_warmups(self) -> None:
        if self.design == PER_GRAPH:  # none records with what the warm-ups use
            self.clear()

    def before_record(self) -> None:
        """In the capture window, on the capture stream."""
        if self.design == PER_GRAPH:
            self.clear()  # the warm-ups' go: this graph makes its own, in its pool
            return
        if self.pool is None:
            with self.api.module.device(self.index):
                self.pool = self.api.mem_pool()
        with self.order.inside(), self.api.use_mem_pool(self.pool):
            self.api.prime_workspace()

    def after_record(self) -> None:
        if self.design == PER_GRAPH:
            self.clear()  # freed into its pool, which keeps them for its replays
