"""Graph backends: one interface over cpu (simulated), cuda and npu graphs.

A backend makes graphs of a zero-argument function and reads device memory.
`Graph.capture()` runs the function once and keeps what it returned as
`outputs`; every `replay()` rewrites those same tensors from the inputs the
function closes over (static buffers), exactly as a device graph does.
Graphs are for inference: captures and replays run without autograd.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.utils._pytree import tree_leaves

from gearshift.errors import BackendUnavailable, ConfigError

MemoryReading = tuple[int, int]


class Graph(Protocol):
    outputs: Any

    def capture(self) -> Any: ...

    def replay(self) -> None: ...

    def reset(self) -> None: ...


class Backend(Protocol):
    kind: str
    index: int

    def graph(self, fn: Callable[[], Any]) -> Graph: ...

    def synchronize(self) -> None: ...

    def mem_get_info(self) -> MemoryReading: ...


class CpuGraph:
    """Seed 004's CpuGraph: replay re-runs `fn` and writes its result into the captured outputs
    (`_leaves`: their pytree leaves, flattened once at capture)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn: Callable[[], Any] | None = fn
        self.outputs: Any = None
        self._leaves: list[Any] = []

    @torch.no_grad()
    def capture(self) -> Any:
        assert self.fn is not None, "capture after reset"
        self.outputs = self.fn()
        self._leaves = tree_leaves(self.outputs)
        return self.outputs

    @torch.no_grad()
    def replay(self) -> None:
        assert self.fn is not None, "replay after reset"
        out = self.fn()
        if isinstance(self.outputs, torch.Tensor):  # the common case: no pytree to walk
            self.outputs.copy_(out)
            return
        for dst, src in zip(self._leaves, tree_leaves(out), strict=True):
            if isinstance(dst, torch.Tensor):
                dst.copy_(src)

    def reset(self) -> None:
        self.fn = self.outputs = None
        self._leaves = []


class CpuBackend:
    """Runs everywhere. `memory` is the `mem_get_info` reading: None reads host RAM,
    a `(free, total)` pair or a callable returning one sets it (tests, demos)."""

    kind = "cpu"

    def __init__(
        self, index: int = 0, memory: MemoryReading | Callable[[], MemoryReading] | None = None
    ) -> None:
        self.index = index
        self.memory = memory

    def graph(self, fn: Callable[[], Any]) -> CpuGraph:
        return CpuGraph(fn)

    def synchronize(self) -> None:
        pass

    def mem_get_info(self) -> MemoryReading:
        if self.memory is None:
            page = os.sysconf("SC_PAGE_SIZE")
            return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
        return self.memory() if callable(self.memory) else self.memory


class DeviceGraph:
    """A cuda/npu graph: warmed up on a side stream, then captured into the backend's pool."""

    def __init__(self, backend: DeviceBackend, fn: Callable[[], Any]) -> None:
        self.backend = backend
        self.fn: Callable[[], Any] | None = fn
        self.graph = backend.graph_cls()
        self.outputs: Any = None

    @torch.no_grad()
    def capture(self) -> Any:
        assert self.fn is not None, "capture after reset"
        mod, index = self.backend.module, self.backend.index
        with mod.device(index):
            side = mod.Stream()
            side.wait_stream(mod.current_stream())
            with mod.stream(side):
                for _ in range(self.backend.warmup):
                    self.fn()
            mod.current_stream().wait_stream(side)
            # thread_local: requests may keep running on other threads during a warm-up capture
            with mod.graph(self.graph, pool=self.backend.pool, capture_error_mode="thread_local"):
                self.outputs = self.fn()
        return self.outputs

    def replay(self) -> None:
        self.graph.replay()

    def reset(self) -> None:
        self.graph.reset()
        self.fn = self.outputs = None


class DeviceBackend:
    """`torch.cuda` or `torch.npu` graphs; all graphs of the device share one memory pool."""

    def __init__(
        self, kind: str, index: int, module: Any, graph_cls: type, warmup: int = 2
    ) -> None:
        self.kind, self.index = kind, index
        self.module, self.graph_cls, self.warmup = module, graph_cls, warmup
        with module.device(index):
            self.pool = module.graph_pool_handle()

    def graph(self, fn: Callable[[], Any]) -> DeviceGraph:
        return DeviceGraph(self, fn)

    def synchronize(self) -> None:
        self.module.synchronize(self.index)

    def mem_get_info(self) -> MemoryReading:
        free, total = self.module.mem_get_info(self.index)
        return int(free), int(total)


def get_backend(kind: str = "cpu", index: int = 0) -> Backend:
    """The process-wide backend of one device; BackendUnavailable says what is missing."""
    return _backend(kind, index)


@functools.cache
def _backend(kind: str, index: int) -> Backend:
    if kind == "cpu":
        return CpuBackend(index)
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise BackendUnavailable(
                "cuda: torch.cuda is not available (no GPU or a CPU-only torch)"
            )
        _check_index(kind, index, torch.cuda.device_count())
        return DeviceBackend(kind, index, torch.cuda, torch.cuda.CUDAGraph)
    if kind == "npu":
        try:
            import torch_npu  # noqa: F401  (registers torch.npu)
        except (ImportError, OSError, RuntimeError) as e:
            raise BackendUnavailable(
                "npu: torch_npu cannot be imported (install the `npu` extra and source the"
                f" Ascend CANN toolkit's set_env.sh): {e}"
            ) from e
        if not torch.npu.is_available():
            raise BackendUnavailable("npu: torch_npu sees no NPU (check the CANN driver/toolkit)")
        _check_index(kind, index, torch.npu.device_count())
        return DeviceBackend(kind, index, torch.npu, torch.npu.NPUGraph)
    raise ConfigError("backend", f"unknown backend {kind!r}; expected cpu, cuda or npu")


def backend_for(device: str | torch.device) -> Backend:
    """The backend of a torch device (`"cpu"`, `"cuda:1"`, `"npu"`; parsed here, since plain
    torch rejects `"npu"` until torch_npu is imported)."""
    if isinstance(device, torch.device):
        return get_backend(device.type, device.index or 0)
    kind, _, index = device.partition(":")
    return get_backend(kind, int(index or 0))


def _check_index(kind: str, index: int, count: int) -> None:
    if not 0 <= index < count:
        raise BackendUnavailable(f"{kind}: device {index} does not exist ({count} visible)")
