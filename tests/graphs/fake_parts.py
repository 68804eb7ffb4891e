"""The fake device's parts (tests/graphs/fake_device.py says what they model): memory
segments and pools, streams, cuBLAS-like workspaces, the pinned-host allocator's graph pools,
captures and the graph class."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from graphs.fake_device import FakeCuda

MiB = 1 << 20
DEFAULT = None  # the default pool's id
STREAMS = 4  # per device, handed out round-robin (torch: 32 per priority)
WORKSPACE = 32 * MiB  # a cuBLAS workspace on sm90 (`parseChosenWorkspaceSize`: 4096 * 8 KiB)
OVERHEAD = 300 * MiB  # the context's, outside the allocator
EXEC_BYTES = 256 << 10  # device memory of one instantiated graph, outside the allocator
RNG_ERROR = "Offset increment outside graph capture encountered unexpectedly."
VOIDS = ("raise", "end", "unwind")  # what torch does with a voided capture (FakeCuda's `void`)
TORCHES = ("2.11", "2.13")  # the generator and empty_cache rules of each (FakeCuda's `torch`)
RACE = "a race on a cuBLAS workspace: two streams use it, the second unordered after the first"


def segment_size(nbytes: int) -> int:
    """The segment a block of `nbytes` needs when no cached one fits (`get_allocation_size`)."""
    size = max(512, -(-nbytes // 512) * 512)
    if size <= MiB:
        return 2 * MiB
    if size < 10 * MiB:
        return 20 * MiB
    return -(-size // (2 * MiB)) * 2 * MiB


@dataclass(eq=False)
class Segment:
    """Device memory; `last`: the stream and its step that last ran a kernel through it (a
    workspace's segment), for the ordering rule (`FakeStream.use`)."""

    size: int
    small: bool
    used: int = 0
    last: tuple[Any, int] | None = None


@dataclass(frozen=True, eq=False)
class FakeEvent:
    """A point of `stream`: its `step`, and what it waited for by then (`seen`)."""

    stream: Any
    step: int
    seen: dict[Any, int]


@dataclass(eq=False)
class Pool:
    use_count: int = 1
    segments: list[Segment] = field(default_factory=list)


class FakeStream:
    """A stream: `step` counts its kernels through workspaces; `seen[other]`: the step of
    `other` this stream waits for (`wait_stream`, `wait_event`)."""

    def __init__(self, device: int, fake: FakeCuda | None = None) -> None:
        self.device, self.fake = device, fake
        self.waited: list[FakeStream] = []
        self.step = 0
        self.seen: dict[FakeStream, int] = {}

    def wait_stream(self, other: FakeStream) -> None:
        self.waited.append(other)
        self.wait_event(other.record_event())

    def record_event(self) -> FakeEvent:
        return FakeEvent(self, self.step, dict(self.seen))

    def wait_event(self, event: FakeEvent) -> None:
        """What the event's stream had done and waited for, this one waits for (transitive)."""
        for stream, step in [*event.seen.items(), (event.stream, event.step)]:
            self.seen[stream] = max(self.seen.get(stream, -1), step)

    def use(self, segment: Segment) -> None:
        """A kernel on this stream through `segment`: a race (raises) unless the stream that
        used it last is this one or this one waits for that use."""
        last = segment.last
        if last is not None and last[0] is not self and self.seen.get(last[0], -1) < last[1]:
            raise RuntimeError(RACE)
        self.step += 1
        segment.last = (self, self.step)

    def synchronize(self) -> None:
        """`cudaStreamSynchronize`: voids a capture on this stream only."""
        if self.fake is not None:
            self.fake.calls["stream_synchronize"] += 1
            self.fake._void([c for c in self.fake.captures if c.stream is self],
                            "cudaStreamSynchronize")


@dataclass(eq=False)
class Workspace:
    """A cuBLAS workspace of one (handle, stream): a block of `pool`; `graphs` recorded with it
    (live ones)."""

    pool: Any
    segment: Segment
    size: int
    freed: bool = False
    graphs: set[Any] = field(default_factory=set)


class FakeHost:
    """The pinned-host allocator's graph pools (`CachingHostAllocatorImpl` in
    `aten/src/ATen/core/CachingHostAllocator.h`; `CUDAGraph::capture_begin` calls its
    `begin_allocate_to_pool` with a stream filter that reads the graph's `capture_id_`, a
    closure over the CUDAGraph itself). While any pool records (`captures_underway_`), every
    pinned allocation runs every entry's filter: one whose graph is gone is a use after free.
    No Python binding ends or releases a host pool: only the CUDAGraph does."""

    def __init__(self) -> None:
        self.recording: list[tuple[Any, weakref.ref[FakeGraph]]] = []
        self.use: dict[Any, int] = {}
        self.freeable: set[Any] = set()
        self.filtered = 0  # pinned allocations that ran the filters (the slow path)

    def begin(self, pool: Any, graph: FakeGraph) -> None:
        if pool in self.use and self.use[pool] <= 0:
            raise RuntimeError("INTERNAL ASSERT FAILED: it->second->use_count > 0")
        if any(p == pool for p, _ in self.recording):
            raise RuntimeError("beginAllocateToPool: already recording to mempool_id")
        self.use[pool] = self.use.get(pool, 0) + 1
        self.recording.append((pool, weakref.ref(graph)))

    def end(self, pool: Any) -> None:
        for i, (p, _) in enumerate(self.recording):
            if p == pool:
                del self.recording[i]
                return
        raise RuntimeError("endAllocatePool: not currently recording to mempool_id")

    def release(self, pool: Any) -> None:
        self.use[pool] -= 1
        if self.use[pool] < 0:
            raise RuntimeError("INTERNAL ASSERT FAILED: uc >= 0")
        if self.use[pool] == 0:
            self.freeable.add(pool)

    def allocate(self, stream: FakeStream) -> Any:
        """The pool a pinned allocation on `stream` lands in (None: the default one)."""
        if not self.recording:
            return None  # captures_underway_empty_: the fast path
        self.filtered += 1
        for pool, ref in self.recording:
            graph = ref()
            if graph is None:
                raise RuntimeError("use after free: a pinned allocation ran the stream filter of"
                                   " a destroyed CUDAGraph (its capture never ended in the"
                                   " pinned-host allocator)")
            if graph.capture is not None and graph.capture.stream is stream:
                return pool
        return None


@dataclass(eq=False)
class Capture:
    """A stream capture underway."""

    graph: FakeGraph
    stream: FakeStream
    thread: int
    mode: str
    voided: bool = False


class FakeGraph:
    """`CUDAGraph`: a tape of the ops recorded on its stream, in the pool it was given."""

    fake: FakeCuda  # set on the class each FakeCuda makes

    def __init__(self) -> None:
        self.tape: list[tuple[Callable[..., Any], tuple[Any, ...], torch.Tensor]] = []
        self.ended = False
        self.pool_id: Any = None
        self.device = 0
        self.capture: Capture | None = None
        self.stream: FakeStream | None = None
        self.workspaces: set[Workspace] = set()
        self.routing = False  # both allocators record into its pool (`capturing_to_pool_`)
        self.began = False  # it holds its pools (`allocated_pool_`)

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        f = self.fake
        with f.lock:
            stream = f.current_stream()
            if stream is f.default_streams[stream.device]:
                raise RuntimeError("CUDA graphs must be captured on a non-default stream.")
            if f.captures:
                raise RuntimeError("a capture is underway: only one may be, in a process")
            pid = pool if pool is not None else (next(f.ids), 0)
            pools, device = f.pools[stream.device], stream.device
            if pid in pools:
                if pools[pid].use_count <= 0:
                    raise RuntimeError("INTERNAL ASSERT FAILED: it->second->use_count > 0")
                pools[pid].use_count += 1
            else:
                pools[pid] = Pool()
            if pid in f.recording[device]:
                raise RuntimeError("beginAllocateToPool: already recording to mempool_id")
            f.recording[device].append(pid)
            f.host.begin(pid, self)
            self.routing = self.began = True
            self.capture = Capture(self, stream, threading.get_ident(), capture_error_mode)
            f.captures.append(self.capture)
            self.pool_id, self.device, self.stream = pid, device, stream
            f.rng_capturing[device] = True  # the default generator, registered: capture_prologue
            if not f.rng_global:  # 2.13: capture_begin syncs the default stream instead
                f.calls["default_stream_sync"] += 1

    def capture_end(self) -> None:
        f = self.fake
        with f.lock:
            capture = self.capture
            if capture is None:
                raise RuntimeError("capture_end() called before capture_begin().")
            if f.current_stream() is not capture.stream:
                raise RuntimeError("Capture must end on the same stream it began on.")
            f.captures.remove(capture)  # the stream's capture ends, voided or not
            self.capture = None
            if capture.voided and f.void == "raise":  # AT_CUDA_CHECK before the ends
                raise RuntimeError("cudaErrorStreamCaptureInvalidated: the capture was voided")
            self._end_routing()
            if capture.voided:
                raise RuntimeError("cudaErrorStreamCaptureInvalidated: the capture was voided")
            f.rng_capturing[self.device] = False  # capture_epilogue: only after a good end
            self.ended = True
            f.live_graphs += 1

    def _end_routing(self) -> None:
        self.fake.recording[self.device].remove(self.pool_id)
        self.fake.host.end(self.pool_id)
        self.routing = False

    def replay(self) -> None:
        if not self.ended:
            raise RuntimeError("Called CUDAGraph::replay without a preceding successful capture.")
        f = self.fake
        if f.rng_global and f.rng_capturing[self.device] and not f.capturing_here():
            raise RuntimeError(RNG_ERROR)  # replay_prologue: increase(wholegraph_increment)
        stream = f.current_stream()
        for ws in self.workspaces:  # a freed one is safe only in a pool no one else takes from
            if ws.freed and (ws.pool is DEFAULT or ws.pool in f.freeable[self.device]
                             or ws.pool not in f.pools[self.device]):
                raise RuntimeError("an illegal memory access was encountered: a replay through"
                                   " a freed cuBLAS workspace")
            stream.use(ws.segment)
        for fn, args, out in self.tape:
            out.copy_(fn(*args))
        self.fake.calls["replay"] += 1

    def reset(self) -> None:
        with self.fake.lock:
            self.capture = None  # a stream still capturing goes on capturing (as in torch)
            if self.stream is not None:  # PR #175276: its capture stream's workspaces go
                self.fake.clear_workspaces(self.stream)
            f = self.fake
            unwinds = f.void == "unwind"  # pytorch PR #190348: an abandoned capture's pools too
            if self.routing and unwinds:
                self._end_routing()
            if self.ended or (self.began and unwinds):
                f.release_pool(self.device, self.pool_id)
                f.host.release(self.pool_id)
                f.live_graphs -= self.ended
                self.ended = self.began = False
            for ws in self.workspaces:
                ws.graphs.discard(self)
            self.tape, self.workspaces = [], set()

    def pool(self) -> Any:
        if not self.ended:
            raise RuntimeError("Called CUDAGraph::pool() without a preceding successful capture.")
        return self.pool_id
