"""Device graphs (cuda, npu): a memory pool per graph, captures beside live requests.

The rules follow the allocators' and graphs' sources (torch `c10/cuda/CUDACachingAllocator.cpp`,
`aten/src/ATen/cuda/CUDAGraph.cpp`, `torch/cuda/graphs.py`; torch_npu `NPUCachingAllocator.cpp`,
`NPUGraph.cpp`, `torch_npu/npu/graphs.py`, which mirror them); docs/architecture.md, "Graphs on
devices", says why each holds.

- **A pool per graph.** Every capture gets a fresh `graph_pool_handle()`; the graph's `reset()`
  drops that pool's use count to 0, which makes it freeable, and `collect()` (`empty_cache()`)
  returns its segments to the device. A pool id is never captured into twice, so the allocator's
  `use_count > 0` assertion (a capture into a pool whose graphs are all gone) cannot fire.
- **Captures**: one at a time per process (`CAPTURE_LOCK`, held from `capture_begin` to
  `capture_end` and by `collect`, since `empty_cache()` asserts that no capture is underway), on
  the backend's own stream of its device, through `capture_begin(pool=, capture_error_mode=
  "thread_local")`: no device synchronize and no `empty_cache()`, which `torch.cuda.graph` /
  `torch.npu.graph` do on entry. The warm-up runs come first, on the same stream, outside the lock.
- **A failed capture** resets its graph and gives its pool back (ending the allocator's
  recording into it with its own hooks when `capture_end` could not), and raises; the pool is
  never used again. A pool that could not be ended (no hook) stays recording in the allocator:
  `collect()` then never calls `empty_cache()` again in this process (it would assert).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)
CAPTURE_LOCK = threading.Lock()  # one capture underway per process, and none during collect()
CAPTURE_MODE = "thread_local"  # other threads' allocations and syncs do not void the capture
_STUCK: set[tuple[str, int, Any]] = set()  # pools the allocator may still record into
MemoryReading = tuple[int, int]


@dataclass(frozen=True)
class DeviceApi:
    """What a device backend uses of `torch.cuda` / `torch.npu` (or of a fake of them).

    `module`: `device`, `Stream`, `stream`, `current_stream`, `synchronize`, `empty_cache`,
    `mem_get_info`, `memory_reserved`, `graph_pool_handle`; `graph_cls`:
    `capture_begin(pool=, capture_error_mode=)`, `capture_end`, `replay`, `reset`, `pool`.
    `end_allocate` and `release_pool(index, pool)` are the allocator's own `endAllocateToPool` /
    `releasePool` (what `torch.cuda.use_mem_pool` calls on exit), used only to give back the
    pool of a capture whose end failed."""

    kind: str
    module: Any
    graph_cls: Any
    end_allocate: Callable[[int, Any], None] | None = None
    release_pool: Callable[[int, Any], None] | None = None


class DeviceBackend:
    """Graphs of one device: a pool per graph, captured on `stream` (made once, on the device).

    `max_graphs`: the most graphs the device may hold (None: no cap), with `limit_reason`
    saying why. `stats`: captures, capture failures, collects, collects skipped."""

    def __init__(
        self,
        api: DeviceApi,
        index: int,
        warmup: int = 2,
        max_graphs: int | None = None,
        limit_reason: str = "",
    ) -> None:
        self.api, self.kind, self.index, self.warmup = api, api.kind, index, warmup
        self.max_graphs, self.limit_reason = max_graphs, limit_reason
        with api.module.device(index):
            self.stream = api.module.Stream()
        self.stats = {"captures": 0, "capture_failures": 0, "collects": 0, "collects_skipped": 0}

    def graph(self, fn: Callable[[], Any]) -> DeviceGraph:
        return DeviceGraph(self, fn)

    def synchronize(self) -> None:
        self.api.module.synchronize(self.index)

    def collect(self) -> bool:
        """Return the memory of released graphs to the device (`empty_cache()`), unless a
        capture is underway (waits for it) or a failed one left a pool recording (skipped)."""
        with CAPTURE_LOCK:
            if _STUCK:
                self.stats["collects_skipped"] += 1
                log.warning(
                    "%s:%d: not emptying the cache: a failed capture left pools %s recording",
                    self.kind, self.index, sorted(map(str, _STUCK)),
                )
                return False
            with self.api.module.device(self.index):
                self.api.module.empty_cache()
            self.stats["collects"] += 1
            return True

    def mem_get_info(self) -> MemoryReading:
        free, total = self.api.module.mem_get_info(self.index)
        return int(free), int(total)

    def reserved(self) -> int | None:
        """Bytes this process's allocator holds on the device; None if it cannot tell."""
        try:
            return int(self.api.module.memory_reserved(self.index))
        except Exception:
            return None

    def new_pool(self) -> Any:
        """The pool of the next capture: a fresh one (a subclass may share one)."""
        with self.api.module.device(self.index):
            return self.api.module.graph_pool_handle()

    def record(self, graph: Any, pool: Any, fn: Callable[[], Any]) -> tuple[Any, int | None]:
        """Capture `fn()` into `graph` and `pool` on the current stream; returns its outputs
        and the bytes the allocator reserved meanwhile (the pool's; None if it cannot tell).
        On failure the graph and its pool are given back (`abandon`) and the error raised."""
        with CAPTURE_LOCK:
            before = self.reserved()
            try:
                graph.capture_begin(pool=pool, capture_error_mode=CAPTURE_MODE)
            except BaseException:
                self.abandon(graph, pool, began=False)
                raise
            try:
                outputs = fn()
            except BaseException:
                self.abandon(graph, pool, began=True)
                raise
            try:
                graph.capture_end()
            except BaseException:
                self.abandon(graph, pool, began=False)
                raise
            self.stats["captures"] += 1
            after = self.reserved()
            held = None if before is None or after is None else max(after - before, 0)
            return outputs, held

    def abandon(self, graph: Any, pool: Any, began: bool) -> None:
        """After a failed capture: end it (`began`: it is still recording), reset the graph
        (which releases the pool if the capture ended) and, if it never ended, end the
        allocator's recording into the pool and release it with the allocator's hooks."""
        self.stats["capture_failures"] += 1
        if began:
            with contextlib.suppress(Exception):
                graph.capture_end()
        try:
            graph.pool()  # raises unless a capture ended: then reset() releases the pool
            ended = True
        except Exception:
            ended = False
        with contextlib.suppress(Exception):
            graph.reset()
        if ended:
            return
        hooks = (self.api.end_allocate, self.api.release_pool)
        for hook in hooks:
            if hook is not None:
                with contextlib.suppress(Exception):  # e.g. "not currently recording"
                    hook(self.index, pool)
        if self.api.end_allocate is None:
            _STUCK.add((self.kind, self.index, pool))


class DeviceGraph:
    """One graph of a device backend: `capture()` warms `fn` up on the backend's stream, then
    records it into a pool of its own (`pool_bytes`: what the allocator reserved while it
    recorded, None before or when it cannot tell); `replay()` runs on the caller's current
    stream."""

    def __init__(self, backend: DeviceBackend, fn: Callable[[], Any]) -> None:
        self.backend = backend
        self.fn: Callable[[], Any] | None = fn
        self.graph = backend.api.graph_cls()
        self.outputs: Any = None
        self.pool_bytes: int | None = None

    @torch.no_grad()
    def capture(self) -> Any:
        assert self.fn is not None, "capture after reset"
        backend, mod = self.backend, self.backend.api.module
        with mod.device(backend.index):
            caller = mod.current_stream()
            backend.stream.wait_stream(caller)  # the caller's writes (buffers) come first
            with mod.stream(backend.stream):
                for _ in range(backend.warmup):
                    self.fn()
                self.outputs, self.pool_bytes = backend.record(self.graph, backend.new_pool(),
                                                               self.fn)
            caller.wait_stream(backend.stream)
        return self.outputs

    def replay(self) -> None:
        self.graph.replay()

    def reset(self) -> None:
        """Drop the graph and its outputs: its pool becomes freeable (`collect()` frees it)."""
        self.graph.reset()
        self.fn = self.outputs = None
