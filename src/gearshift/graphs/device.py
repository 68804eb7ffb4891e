"""Device graphs (cuda, npu): a memory pool per graph, captures beside live requests.

The rules follow the allocators' and graphs' sources (torch `c10/cuda/CUDACachingAllocator.cpp`,
`aten/src/ATen/cuda/CUDAGraph.cpp`, `torch/cuda/graphs.py`; torch_npu `NPUCachingAllocator.cpp`,
`NPUGraph.cpp`, `torch_npu/npu/graphs.py`, which mirror them); docs/architecture.md, "Graphs on
devices" and "Hazards on the device", says why each holds.

- **A pool per graph.** Every capture gets a fresh `graph_pool_handle()`; the graph's `reset()`
  drops that pool's use count to 0, which makes it freeable, and `collect()` (`empty_cache()`)
  returns its segments to the device. A pool id is never captured into twice, so the allocator's
  `use_count > 0` assertion (a capture into a pool whose graphs are all gone) cannot fire.
- **Workspaces** (`graphs.workspaces`): where the torch has `MemPool`, `use_mem_pool` and
  `current_blas_handle`, every graph records with the capturing thread's cuBLAS workspace kept
  in a pool of the backend's own ("kept": a graph's pool holds its activations only); else each
  graph makes one in its own pool ("per_graph"). Either way no reset and no clear frees a
  workspace a live graph uses to anyone else. The warm-ups run on a stream of their own
  (`warm_stream`), never through a workspace a graph recorded with; every replay runs in the
  backend's one order across streams (`order`: a replay starts after the one before it).
- **The capture window** (`GUARD`, one per process): a recording is exclusive; what a capture
  forbids beside it takes the guard shared and waits for it (device synchronizes,
  `empty_cache()`, resets, replays, `outside_capture()`). Captures run one at a time, on the
  backend's own stream, through `capture_begin(pool=, capture_error_mode="thread_local")`: no
  device synchronize and no `empty_cache()` (`torch.cuda.graph` does both on entry).
- **A failed capture** is always ended, resets its graph and gives its pool back (with the
  allocator's hooks when torch's `capture_end` could not) and, if it had begun, makes one good
  empty capture so that the default generator leaves capture mode (`abandon`); a pool no hook
  could end leaves `collect()` off for the process, and a graph the pinned-host allocator may
  still read is kept (`_STUCK`, `_KEPT`). A capture refused for want of device streams (npu
  207008) raises GraphLimit and the backend refuses captures (`full`) until a release.
- **Streams shared by the processes of a device** (npu, `graphs.streams`): each graph counts
  `streams_per_graph` in the device's ledger from before its capture until its reset.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from gearshift.errors import GearshiftError
from gearshift.graphs import streams
from gearshift.graphs.window import GUARD as GUARD
from gearshift.graphs.window import CaptureGuard as CaptureGuard
from gearshift.graphs.window import outside_capture as outside_capture
from gearshift.graphs.workspaces import Order, Workspaces

log = logging.getLogger(__name__)
CAPTURE_MODE = "thread_local"  # other threads' allocations do not void the capture
OUT_OF_STREAMS = ("207008", "Stream resources are insufficient")  # npu: no stream left
_STUCK: set[tuple[str, int, Any]] = set()  # pools the allocator may still record into
_KEPT: list[Any] = []  # graphs the pinned-host allocator may still read: never freed
MemoryReading = tuple[int, int]


class GraphLimit(GearshiftError):
    """A device holds as many graphs as it may: no capture beyond; the message says why."""


@dataclass(frozen=True)
class DeviceApi:
    """What a device backend uses of `torch.cuda` / `torch.npu` (or of a fake of them).

    `module`: `device`, `Stream`, `stream`, `current_stream`, `synchronize`, `empty_cache`,
    `mem_get_info`, `memory_reserved`, `graph_pool_handle`; `graph_cls`:
    `capture_begin(pool=, capture_error_mode=)`, `capture_end`, `replay`, `reset`, `pool`.
    `end_allocate` and `release_pool(index, pool)` are the allocator's own `endAllocateToPool` /
    `releasePool` (what `torch.cuda.use_mem_pool` calls on exit), used only to give back the
    pool of a capture whose end failed. `clear_workspaces`: frees the process's cuBLAS
    workspaces (`torch._C._cuda_clearCublasWorkspaces`; None: the device keeps none).
    `mem_pool`, `use_mem_pool`, `prime_workspace`: `torch.cuda.MemPool`, `use_mem_pool` and a
    call that makes the current thread's workspaces on the current stream (None: the "kept"
    workspace design is not offered; `graphs.workspaces`)."""

    kind: str
    module: Any
    graph_cls: Any
    end_allocate: Callable[[int, Any], None] | None = None
    release_pool: Callable[[int, Any], None] | None = None
    clear_workspaces: Callable[[], None] | None = None
    mem_pool: Callable[[], Any] | None = None
    use_mem_pool: Callable[[Any], Any] | None = None
    prime_workspace: Callable[[], Any] | None = None


class DeviceBackend:
    """Graphs of one device: a pool per graph, captured on `stream` (made once, on the device).

    `max_graphs`: the most graphs the device may hold (None: no cap), with `limit_reason`
    saying why; `full`: the device refused a capture for want of streams (until a release);
    `streams`: the device's ledger shared with the other processes on it (None: none; with
    `share_streams`, the installed one's, `graphs.streams.ledger`, once there is one), in which
    each graph counts `streams_per_graph`. `stats`: captures, capture failures, collects,
    collects skipped, stream refusals (the device's), budget refusals (the ledger's)."""

    def __init__(
        self,
        api: DeviceApi,
        index: int,
        warmup: int = 2,
        max_graphs: int | None = None,
        limit_reason: str = "",
        streams: Any = None,
        streams_per_graph: int = 1,
        share_streams: bool = False,
    ) -> None:
        self.api, self.kind, self.index, self.warmup = api, api.kind, index, warmup
        self.max_graphs, self.limit_reason = max_graphs, limit_reason
        self.streams, self.streams_per_graph = streams, streams_per_graph
        self.share_streams = share_streams
        self.full = False
        with api.module.device(index):
            self.stream = api.module.Stream()
            self.warm_stream = api.module.Stream()  # round-robin: not `stream` (the next one)
        self.order = Order(api.module, index)
        self.workspaces = Workspaces(api, index, self.order)
        self._collects = [0, 0]  # `collecting()` blocks open, collects deferred to their end
        self._collect_lock = threading.Lock()
        self.stats = {"captures": 0, "capture_failures": 0, "collects": 0, "collects_skipped": 0,
                      "stream_refusals": 0, "budget_refusals": 0, "host_pools_left": 0}

    def graph(self, fn: Callable[[], Any]) -> DeviceGraph:
        return DeviceGraph(self, fn)

    def synchronize(self) -> None:
        """The whole device, once no capture is underway in this process (waits for it)."""
        with GUARD.shared():
            self.api.module.synchronize(self.index)

    def stream_synchronize(self) -> None:
        """The caller's current stream only: safe beside a capture."""
        self.api.module.current_stream(self.index).synchronize()

    @contextlib.contextmanager
    def collecting(self) -> Iterator[None]:
        """Collects asked for inside run once, at the end (several releases of one tick)."""
        with self._collect_lock:
            self._collects[0] += 1
        try:
            yield
        finally:
            with self._collect_lock:
                self._collects[0] -= 1
                due = self._collects == [0, 1]
                self._collects[1] *= not due
            if due:
                self.collect()

    def collect(self) -> bool:
        """Return the memory of released graphs to the device (`empty_cache()`), unless a
        capture is underway (waits for it) or a failed one left a pool recording (skipped);
        inside `collecting()`, once at its end (True meanwhile)."""
        with self._collect_lock:
            if self._collects[0]:
                self._collects[1] = 1
                return True
        with GUARD.shared():
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
        On failure the graph and its pool are given back (`abandon`) and the error raised
        (GraphLimit when the device has no stream left)."""
        with GUARD.exclusive():
            self.workspaces.before_record()
            before = self.reserved()
            try:
                graph.capture_begin(pool=pool, capture_error_mode=CAPTURE_MODE)
            except BaseException as e:
                self.abandon(graph, pool, began=False)
                self._out_of_streams(e)
                raise
            try:
                outputs = fn()
            except BaseException as e:
                self.abandon(graph, pool, began=True)
                self._out_of_streams(e)
                raise
            try:
                graph.capture_end()
            except BaseException as e:
                self.abandon(graph, pool, began=True, ended=True)
                self._out_of_streams(e)
                raise
            self.workspaces.after_record()
            self.stats["captures"] += 1
            after = self.reserved()
            held = None if before is None or after is None else max(after - before, 0)
            return outputs, held

    def take_streams(self) -> None:
        """Count a new graph's streams in the shared ledger (if any); GraphLimit, naming what
        the device's processes hold, if they would pass its budget."""
        ledger, n = self._ledger(), self.streams_per_graph
        if ledger is None:
            return
        others = ledger.take(n)
        if others is None:
            return
        self.stats["budget_refusals"] += 1
        raise GraphLimit(
            f"{self.kind}:{self.index}: its processes hold {others + ledger.held} of the"
            f" device's {ledger.budget} streams (this one {ledger.held}) and a graph takes {n};"
            " no capture until one of them releases a graph. "
            f"{self.limit_reason or 'Capture fewer graphs.'}"
        )

    def shared_room(self) -> int | None:
        """Graphs the device's shared stream budget still has room for (None: no ledger)."""
        ledger = self._ledger()
        if ledger is None:
            return None
        return max(ledger.budget - ledger.total(), 0) // self.streams_per_graph

    def give_streams(self) -> None:
        if self.streams is not None:
            self.streams.give(self.streams_per_graph)

    def _ledger(self) -> Any:
        if self.streams is None and self.share_streams:  # connect() may install it later
            self.streams = streams.ledger(self.index)
        return self.streams

    def _out_of_streams(self, error: BaseException) -> None:
        """Raise GraphLimit (and be `full`) if the device refused the capture for want of
        streams; else return (the caller raises `error`)."""
        if not any(m in str(error) for m in OUT_OF_STREAMS):
            return
        self.full = True
        self.stats["stream_refusals"] += 1
        raise GraphLimit(
            f"{self.kind}:{self.index} has no stream left for another graph ({error}); no"
            " capture is tried again until a graph is released. "
            f"{self.limit_reason or 'Capture fewer graphs.'}"
        ) from error

    def abandon(self, graph: Any, pool: Any, began: bool, ended: bool = False) -> None:
        """After a failed capture (in the window): end it (`began` and not `ended`: it is still
        recording), reset the graph (which releases the pool if the capture ended) and, if it
        never ended, end the allocator's recording into the pool and release it with the
        allocator's hooks; if it had begun, `restore` the generator."""
        self.stats["capture_failures"] += 1
        if began and not ended:
            with contextlib.suppress(Exception):
                graph.capture_end()
        try:
            self._give_back(graph, pool)
        finally:
            self.workspaces.after_record()
            if began:
                self.restore()

    def restore(self) -> None:
        """One good empty capture: a voided one can leave the default generator in capture
        mode (its `capture_epilogue` never ran), refusing every increment outside a capture."""
        graph = self.api.graph_cls()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "The CUDA Graph is empty"
                graph.capture_begin(pool=self.new_pool(), capture_error_mode=CAPTURE_MODE)
                graph.capture_end()
        except Exception as e:  # logged: the next good capture restores it anyway
            log.warning("%s:%d: could not restore the generator after a failed capture: %r",
                        self.kind, self.index, e)
        with contextlib.suppress(Exception):
            graph.reset()

    def _give_back(self, graph: Any, pool: Any) -> None:
        try:
            graph.pool()  # raises unless a capture ended: then reset() releases the pool
            ended = True
        except Exception:
            ended = False
        with contextlib.suppress(Exception):
            graph.reset()
        if ended:
            return
        end, release = self.api.end_allocate, self.api.release_pool
        ended_here = False
        if end is not None:
            try:
                end(self.index, pool)
                ended_here = True  # torch's capture_end raised before ending either allocator
            except Exception:  # "not currently recording": torch ended both (pytorch #180395)
                pass
        if release is not None:
            with contextlib.suppress(Exception):  # torch's reset may have released it already
                release(self.index, pool)
        if end is None:
            _STUCK.add((self.kind, self.index, pool))
        if end is None or ended_here:  # the pinned-host allocator still records into `pool`
            _KEPT.append(graph)
            self.stats["host_pools_left"] += 1
            log.warning("%s:%d: a voided capture left the pinned-host allocator recording into"
                        " pool %s (torch ends it only from capture_end since pytorch PR"
                        " #180395): its graph is kept, and every pinned allocation checks it",
                        self.kind, self.index, pool)


class DeviceGraph:
    """One graph of a device backend: `capture()` warms `fn` up on the backend's warm-up stream,
    then records it on its capture stream into a pool of its own (`pool_bytes`: what the
    allocator reserved while it recorded, None before or when it cannot tell); `replay()` runs
    on the caller's current stream."""

    def __init__(self, backend: DeviceBackend, fn: Callable[[], Any]) -> None:
        self.backend = backend
        self.fn: Callable[[], Any] | None = fn
        self.graph = backend.api.graph_cls()
        self.outputs: Any = None
        self.pool_bytes: int | None = None
        self.held = False  # a capture succeeded: its reset gives the device room back

    @torch.no_grad()
    def capture(self) -> Any:
        assert self.fn is not None, "capture after reset"
        backend, mod = self.backend, self.backend.api.module
        if backend.full:
            raise GraphLimit(f"{backend.kind}:{backend.index} refused a capture for want of"
                             " streams: none is tried until a graph is released")
        backend.take_streams()
        try:
            with mod.device(backend.index):
                caller = mod.current_stream()
                backend.warm_stream.wait_stream(caller)  # the caller's writes come first
                backend.stream.wait_stream(caller)
                with mod.stream(backend.warm_stream):
                    with GUARD.shared():
                        backend.workspaces.before_warmups()
                    for _ in range(backend.warmup):
                        self.fn()
                backend.stream.wait_stream(backend.warm_stream)
                with mod.stream(backend.stream):
                    self.outputs, self.pool_bytes = backend.record(
                        self.graph, backend.new_pool(), self.fn)
                    self.held = True
                caller.wait_stream(backend.stream)
        except BaseException:
            if not self.held:
                backend.give_streams()
            raise
        return self.outputs

    def replay(self) -> None:
        """On the caller's stream, outside a capture (its generator prologue would fail),
        after every replay before it on any stream (`DeviceBackend.order`)."""
        with GUARD.shared(), self.backend.order.inside():
            self.graph.replay()

    def timed_replay(self, clock: Any) -> float:
        """One replay's seconds by `clock`, its stream idle before and after (what came before
        on it and the replay it is ordered after, not other streams' later work)."""
        with GUARD.shared(), self.backend.order.inside():
            stream = self.backend.api.module.current_stream(self.backend.index)
            stream.synchronize()
            began = clock.now()
            self.graph.replay()
            stream.synchronize()
            return float(clock.now() - began)

    def reset(self) -> None:
        """Drop the graph and its outputs: its pool becomes freeable (`collect()` frees it)."""
        with GUARD.shared():
            self.graph.reset()
        self.fn = self.outputs = None
        if self.held:
            self.held = self.backend.full = False
            self.backend.give_streams()
