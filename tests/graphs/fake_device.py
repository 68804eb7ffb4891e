"""A fake `torch.cuda` for the CPU suite: the caching allocator's graph pools and the rules of
capture, as the sources have them, for the device backend (`graphs.device`) to run against.

What it models, and where (torch 2.13: `c10/cuda/CUDACachingAllocator.cpp`, class
`DeviceCachingAllocator`; `aten/src/ATen/cuda/CUDAGraph.cpp`, class `CUDAGraph`;
`torch/cuda/graphs.py`, class `graph`; torch_npu's `NPUCachingAllocator.cpp` and `NPUGraph.cpp`
mirror them):

- Memory. Tensors made by `op` take blocks of segments, sized as `get_allocation_size` does
  (at most 1 MiB: 2 MiB segments; under 10 MiB: 20 MiB ones; larger: rounded up to 2 MiB). A
  block is freed when its tensor dies, into its pool's cache; `mem_get_info` counts every
  segment held as used, free or not.
- Pools. `capture_begin` makes a new pool (use count 1) or, for an existing id, asserts
  `use_count > 0` and increments it, then refuses an id already recording
  (`beginAllocateToPool`); `reset()` of a graph whose capture ended decrements it and a pool at
  0 becomes freeable (`releasePool`); only `empty_cache()` gives the free segments of freeable
  pools and of the default pool back, erasing a pool left without any (`release_cached_blocks`),
  and it asserts that no pool is recording (`synchronize_and_free_events`).
- Captures. Only on a non-default stream (`CUDAGraph::capture_begin`), one at a time in the
  process (the rule `graph.__init__` states). Ops on the capturing stream allocate from its
  pool and are recorded, and `replay()` runs them again into the same tensors. `synchronize()`
  on the capturing thread, or on any thread in "global" mode, and a new segment for another
  thread in "global" mode, fail and void the capture; `capture_end()` of a voided capture raises
  and, as torch before pytorch PR #180395 (`void="raise"`), leaves its pool recording in both
  allocators, with its use (`endAllocateToPool` and the host allocator's
  `end_allocate_to_pool` come after `cudaStreamEndCapture`'s check); `void="end"` (#180395)
  ends both recordings first and still releases nothing on `reset()`; `void="unwind"` (#190348,
  `allocated_pool_` / `capturing_to_pool_`) also ends, on `reset()`, a capture abandoned before
  `capture_end`, and releases both pools of any capture that began.
- The pinned-host allocator (`FakeHost`, `pinned()`): a graph pool per capture beside the
  device's, whose recording entry reads its CUDAGraph on every pinned allocation.
- While a pool records, an allocation gets no free-and-retry
  before out of memory (`malloc`: `release_cached_blocks` only if `captures_underway.empty()`).
- `graph(...)`, the context manager: `synchronize()` and `empty_cache()` on entry, one default
  capture stream for the whole process (a class attribute in torch).

As strict as the device on what breaks beside captures and releases (docs/architecture.md,
"Hazards on the device"):

- Workspaces. Every kernel that multiplies matrices (`gemm`, `blas`) runs through the cuBLAS
  workspace of its (handle, stream), a handle being a thread's (`aten/src/ATen/cuda/
  CublasHandlePool.cpp`, `setWorkspaceForHandle` and `cublas_handle_stream_to_workspace`: made
  on first use, WORKSPACE bytes as `parseChosenWorkspaceSize` gives sm90, from the current
  pool: a capture's own pool when recording, a `use_mem_pool` pool when routed);
  `current_blas_handle()` makes it without a kernel (`getCurrentCUDABlasHandle`). A graph keeps
  the workspace it recorded with. `clear_workspaces()` (`_cuda_clearCublasWorkspaces`) frees
  every workspace, and a graph's `reset()` frees its capture stream's
  (`clearCublasWorkspacesForStream` in `CUDAGraph::reset`, pytorch PR #175276). A replay through
  a freed workspace of the default pool, or of a pool now freeable, faults (its memory may be
  anyone's); one in a pool no one else allocates from (a graph's own, a kept `MemPool`) lives
  with the pool. Two kernels through one workspace on two streams race unless the second's
  stream waits for the first (`wait_stream`, `wait_event`): `FakeStream.use` raises.
- MemPools (`torch.cuda.MemPool`, `use_mem_pool`): a private pool that no `empty_cache` frees
  while it lives, into which one thread's allocations are routed.
- torch versions (`torch=`): "2.11", the default generator registered for the whole capture, so
  an increment from a stream that is not capturing raises; "2.13", its states keyed by capture id
  (`CUDAGeneratorState::register_graph`, `CUDAGraph::capture_begin`'s `capture_id_`), so none
  does, and `capture_begin` syncs the default stream instead. `empty_cache()` asserts while
  any capture is underway in 2.11, and only when the caller's own stream is capturing in 2.13
  (elsewhere it frees what no capture records into).
- The allocator backend (`allocator=`, `get_allocator_backend()`): "native" or
  "cudaMallocAsync", which refuses a second capture at once (`c10/cuda/
  CUDAMallocAsyncAllocator.cpp`, `beginAllocateToPool`: "Only one capture at a time").
- `synchronize()` (`cudaDeviceSynchronize`) on any thread, in any mode, voids every capture
  underway and raises; `FakeStream.synchronize()` voids only a capture on that stream.
- The default generator (`CUDAGeneratorImpl.cpp`, `CUDAGeneratorState::increase`), on 2.11:
  every `capture_begin` registers it, and until that capture ends well an increment (`randn`,
  or a replay's `replay_prologue`) from a stream that is not capturing raises "Offset increment
  outside graph capture"; a voided capture leaves it so until the next good one.
- Streams come round-robin from STREAMS per device (`getStreamFromPool`), so two `Stream()`s
  may be one. `mem_get_info` reads in 2 MiB steps, less the context's OVERHEAD and EXEC_BYTES
  per instantiated graph.
"""


from __future__ import annotations

import contextlib
import dataclasses
import itertools
import threading
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch

from gearshift.graphs.device import DeviceApi, DeviceBackend
from graphs.fake_parts import (
    DEFAULT,
    EXEC_BYTES,
    OVERHEAD,
    RNG_ERROR,
    STREAMS,
    TORCHES,
    VOIDS,
    WORKSPACE,
    Capture,
    FakeGraph,
    FakeHost,
    FakeStream,
    MiB,
    Pool,
    Segment,
    Workspace,
    segment_size,
)

__all__ = ["FakeCuda", "FakeGraph", "FakeStream", "MiB", "segment_size"]


class FakeCuda:
    """The `torch.cuda` of `devices` fake devices of `total` bytes each (see the module)."""

    def __init__(self, total: int = 1 << 30, devices: int = 1, void: str = "raise",
                 torch: str = "2.11", allocator: str = "native",
                 workspace: int = WORKSPACE) -> None:
        assert void in VOIDS and torch in TORCHES, (void, torch)
        self.void = void  # what torch does with a voided capture (see the module)
        self.torch, self.allocator = torch, allocator
        self.workspace = workspace  # a workspace's bytes (CUBLAS_WORKSPACE_CONFIG's sum)
        self.rng_global = torch == "2.11"  # the generator's capture state is global (2.11)
        self.host = FakeHost()
        self.total = total  # what the allocator may take; the device has OVERHEAD more
        self.lock = threading.RLock()  # the allocator's mutex
        self.pools: list[dict[Any, Pool]] = [{DEFAULT: Pool()} for _ in range(devices)]
        self.freeable: list[set[Any]] = [set() for _ in range(devices)]
        self.recording: list[list[Any]] = [[] for _ in range(devices)]  # captures_underway
        self.captures: list[Capture] = []
        self.default_streams = [FakeStream(d, self) for d in range(devices)]
        self.stream_pool = [[FakeStream(d, self) for _ in range(STREAMS)] for d in range(devices)]
        self.next_stream = [0] * devices
        self.workspaces: dict[tuple[int, FakeStream], Workspace] = {}  # by (handle, stream)
        self.mem_pools: set[Any] = set()  # the MemPools' ids (held while they live)
        self.rng_capturing = [False] * devices  # the default generator's `capturing_`
        self.live_graphs = 0
        self.default_capture_stream: FakeStream | None = None
        self.ids = itertools.count(1)
        self.calls: Counter[str] = Counter()
        self._local = threading.local()
        self.CUDAGraph = type("CUDAGraph", (FakeGraph,), {"fake": self})

    # the backend's view

    def api(self, kind: str = "cuda", hooks: bool = True, design: str = "kept") -> DeviceApi:
        """The backend's view; `design`: "kept" offers `MemPool`, `use_mem_pool` and
        `current_blas_handle` (a kept workspace), "per_graph" withholds them."""
        ends = (self.end_allocate, self.release_pool) if hooks else (None, None)
        kept = (self.MemPool, self.use_mem_pool, self.current_blas_handle)
        extra = kept if design == "kept" else (None, None, None)
        if "mem_pool" not in {f.name for f in dataclasses.fields(DeviceApi)}:
            extra = ()  # a gearshift before the kept design (to run these tests against it)
        return DeviceApi(kind, self, self.CUDAGraph, *ends, lambda: self.clear_workspaces(),
                         *extra)

    def backend(self, index: int = 0, kind: str = "cuda", hooks: bool = True,
                design: str = "kept", **options: Any) -> DeviceBackend:
        return DeviceBackend(self.api(kind, hooks, design), index, **options)

    def get_allocator_backend(self) -> str:
        return self.allocator

    # devices and streams

    def current_device(self) -> int:
        return getattr(self._local, "device", 0)

    @contextlib.contextmanager
    def device(self, index: int) -> Iterator[None]:
        before, self._local.device = self.current_device(), index
        try:
            yield
        finally:
            self._local.device = before

    def Stream(self, device: int | None = None) -> FakeStream:
        """The next of the device's STREAMS, round-robin (`getStreamFromPool`)."""
        device = self.current_device() if device is None else device
        with self.lock:
            i, self.next_stream[device] = self.next_stream[device], self.next_stream[device] + 1
        return self.stream_pool[device][i % STREAMS]

    def current_stream(self, device: int | None = None) -> FakeStream:
        device = self.current_device() if device is None else device
        return getattr(self._local, "streams", {}).get(device, self.default_streams[device])

    @contextlib.contextmanager
    def stream(self, stream: FakeStream) -> Iterator[None]:
        streams = self._local.__dict__.setdefault("streams", {})
        before = streams.get(stream.device)
        streams[stream.device] = stream
        try:
            with self.device(stream.device):
                yield
        finally:
            if before is None:
                del streams[stream.device]
            else:
                streams[stream.device] = before

    def synchronize(self, device: int | None = None) -> None:
        """`cudaDeviceSynchronize`: voids every capture underway, whatever thread or mode."""
        self.calls["synchronize"] += 1
        self._void(list(self.captures), "cudaDeviceSynchronize")

    # the allocator

    def graph_pool_handle(self) -> tuple[int, int]:
        return (0, next(self.ids))

    def mem_get_info(self, device: int | None = None) -> tuple[int, int]:
        """The driver's reading: in 2 MiB steps, less the context and the graphs' execs."""
        device = self.current_device() if device is None else device
        free = self.total - self.reserved(device) - EXEC_BYTES * self.live_graphs
        return free // (2 * MiB) * 2 * MiB, self.total + OVERHEAD

    def reserved(self, device: int = 0) -> int:
        with self.lock:
            return sum(s.size for p in self.pools[device].values() for s in p.segments)

    def memory_reserved(self, device: int | None = None) -> int:
        return self.reserved(self.current_device() if device is None else device)

    def empty_cache(self) -> None:
        """2.11: asserts while any capture is underway; 2.13: only while the caller's stream
        captures, and frees nothing that a capture records into."""
        with self.lock:
            self.calls["empty_cache"] += 1
            here = self.capturing_here() is not None
            if here if not self.rng_global else any(self.recording):
                raise RuntimeError("INTERNAL ASSERT FAILED: captures_underway.empty()")
            for device in range(len(self.pools)):
                self._release_cached(device)

    def end_allocate(self, device: int, pool: Any) -> None:
        with self.lock:
            if pool not in self.recording[device]:
                raise RuntimeError("endAllocatePool: not currently recording to mempool_id")
            self.recording[device].remove(pool)

    def release_pool(self, device: int, pool: Any) -> None:
        with self.lock:
            if pool not in self.pools[device]:
                raise RuntimeError("INTERNAL ASSERT FAILED: it != graph_pools.end()")
            entry = self.pools[device][pool]
            entry.use_count -= 1
            if entry.use_count < 0:
                self.calls["internal_assert"] += 1
                raise RuntimeError("INTERNAL ASSERT FAILED: uc >= 0")
            if entry.use_count == 0:
                self.freeable[device].add(pool)

    def op(self, fn: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
        """`fn(*args)` as a kernel: its output is allocated on the current stream (from the
        pool of a capture underway on it, then recorded for replays)."""
        out = fn(*args)
        stream = self.current_stream()
        capture = next((c for c in self.captures if c.stream is stream), None)
        with self.lock:
            pool = self._pool_here(capture)
            segment, size = self._malloc(stream.device, pool, out.nbytes, capture is not None)
        weakref.finalize(out, self._free, segment, size)
        if capture is not None:  # the tape holds the memory, not the tensors (their blocks)
            alias = tuple(_alias(a) if isinstance(a, torch.Tensor) else a for a in args)
            capture.graph.tape.append((fn, alias, _alias(out)))
        return out

    def pinned(self, nbytes: int) -> torch.Tensor:
        """`torch.empty(nbytes, pin_memory=True)`: the pinned-host allocator's `allocate`."""
        with self.lock:
            self.host.allocate(self.current_stream())
        return torch.empty(nbytes, dtype=torch.uint8)

    def gemm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """`a @ b` as a cuBLAS kernel: through its (handle, stream)'s workspace."""
        return self.blas(torch.matmul, a, b)

    def blas(self, fn: Callable[..., torch.Tensor], *args: Any) -> torch.Tensor:
        """`fn(*args)` as a kernel that multiplies matrices: through its (handle, stream)'s
        workspace (made if none; recorded by a capture, run now otherwise)."""
        stream, capture = self.current_stream(), self.capturing_here()
        ws = self.current_blas_handle()
        with self.lock:
            if capture is not None:
                capture.graph.workspaces.add(ws)
                ws.graphs.add(capture.graph)
            else:
                stream.use(ws.segment)
        return self.op(fn, *args)

    def current_blas_handle(self) -> Workspace:
        """`getCurrentCUDABlasHandle`: this thread's handle on the current stream, with its
        workspace made (in the current pool) if it has none; no kernel runs."""
        stream, capture = self.current_stream(), self.capturing_here()
        key = (threading.get_ident(), stream)
        with self.lock:
            ws = self.workspaces.get(key)
            if ws is None:
                pool = self._pool_here(capture)
                segment, size = self._malloc(stream.device, pool, self.workspace,
                                             capture is not None)
                segment.last = None  # a freed block goes to another stream only once it is idle
                ws = self.workspaces[key] = Workspace(pool, segment, size)
            return ws

    def MemPool(self) -> Any:
        """`torch.cuda.MemPool()`: a private pool held while the object lives."""
        pool = type("MemPool", (), {"id": (next(self.ids), 0)})()
        with self.lock:
            self.pools[self.current_device()][pool.id] = Pool()
            self.mem_pools.add(pool.id)
        return pool

    def graph_pools(self, device: int = 0) -> set[Any]:
        """The ids of the graphs' pools the allocator still has (not the default pool, not a
        MemPool's)."""
        with self.lock:
            return set(self.pools[device]) - {DEFAULT} - self.mem_pools

    @contextlib.contextmanager
    def use_mem_pool(self, pool: Any) -> Iterator[None]:
        """`torch.cuda.use_mem_pool`: this thread's allocations go to `pool` meanwhile."""
        before, self._local.pool = getattr(self._local, "pool", DEFAULT), pool.id
        try:
            yield
        finally:
            self._local.pool = before

    def randn(self, *shape: int) -> torch.Tensor:
        """`torch.randn` on the default generator (see the module)."""
        device = self.current_stream().device
        if self.rng_global and self.capturing_here() is None and self.rng_capturing[device]:
            raise RuntimeError(RNG_ERROR)
        return self.op(lambda: torch.randn(*shape))

    def clear_workspaces(self, stream: FakeStream | None = None) -> None:
        """`_cuda_clearCublasWorkspaces` (every one), or one stream's (a graph's reset)."""
        with self.lock:
            for key in [k for k in self.workspaces if stream is None or k[1] is stream]:
                ws = self.workspaces.pop(key)
                ws.freed = True
                self._free(ws.segment, ws.size)

    def capturing_here(self) -> Capture | None:
        """The capture underway on the current stream, if any."""
        stream = self.current_stream()
        return next((c for c in self.captures if c.stream is stream), None)

    def pool_bytes(self, pool: Any, device: int = 0) -> int:
        with self.lock:
            entry = self.pools[device].get(pool)
            return 0 if entry is None else sum(s.size for s in entry.segments)

    # the torch context manager, for the tests that show what it does

    @contextlib.contextmanager
    def graph(self, cuda_graph: FakeGraph, pool: Any = None, stream: FakeStream | None = None,
              capture_error_mode: str = "global") -> Iterator[None]:
        self.calls["graph_context"] += 1
        if stream is None and self.default_capture_stream is None:
            self.default_capture_stream = self.Stream()
        self.synchronize()
        self.empty_cache()
        with self.stream(stream or self.default_capture_stream):
            cuda_graph.capture_begin(pool=pool, capture_error_mode=capture_error_mode)
            yield
            cuda_graph.capture_end()

    # inside

    def _unsafe(self, what: str) -> None:
        """A call a capture forbids: on the capturing thread, or anywhere in global mode."""
        me = threading.get_ident()
        with self.lock:
            hit = [c for c in self.captures if c.thread == me or c.mode == "global"]
        self._void(hit, what)

    def _void(self, hit: list[Capture], what: str) -> None:
        with self.lock:
            for capture in hit:
                capture.voided = True
        if hit:
            raise RuntimeError(f"{what}: operation not permitted when stream is capturing")

    def _pool_here(self, capture: Capture | None) -> Any:
        """Where an allocation on this thread's current stream goes: the capture's pool, else
        the thread's `use_mem_pool` one, else the default pool."""
        stream = self.current_stream()
        if capture is not None and capture.graph.pool_id in self.recording[stream.device]:
            return capture.graph.pool_id
        return getattr(self._local, "pool", DEFAULT)

    def _malloc(self, device: int, pool: Any, nbytes: int, capturing: bool) -> tuple[Segment, int]:
        size = max(512, -(-nbytes // 512) * 512)
        entry, small = self.pools[device][pool], size <= MiB
        for segment in entry.segments:
            if segment.small == small and segment.size - segment.used >= size:
                segment.used += size
                return segment, size
        if not capturing and self.captures:
            self._unsafe("cudaMalloc")  # a new segment outside the capture
        new = segment_size(nbytes)
        if self.reserved(device) + new > self.total and not self.recording[device]:
            self._release_cached(device)  # the free-and-retry, only with no capture underway
        if self.reserved(device) + new > self.total:
            raise torch.OutOfMemoryError(f"fake device {device}: out of memory ({new} bytes)")
        segment = Segment(new, small, size)
        entry.segments.append(segment)
        return segment, size

    def _free(self, segment: Segment, size: int) -> None:
        with self.lock:
            segment.used -= size

    def _release_cached(self, device: int) -> None:
        pools = self.pools[device]
        for pid in [DEFAULT, *sorted(self.freeable[device])]:
            if pid in self.recording[device]:  # 2.13 frees beside a capture, not its pool
                continue
            entry = pools[pid]
            entry.segments = [s for s in entry.segments if s.used]
            if pid is not DEFAULT and not entry.segments:
                del pools[pid]
                self.freeable[device].discard(pid)


def _alias(t: torch.Tensor) -> torch.Tensor:
    """A tensor on `t`'s memory that does not keep `t` (a view would: its `_base`)."""
    return torch.empty(0, dtype=t.dtype).set_(
        t.untyped_storage(), t.storage_offset(), t.shape, t.stride()
    )
