"""Graph backends: one interface over cpu (simulated), cuda and npu graphs.

A backend makes graphs of a zero-argument function, reads device memory and gives released
graphs' memory back (`collect`). `Graph.capture()` runs the function once and keeps what it
returned as `outputs`; every `replay()` rewrites those same tensors from the inputs the function
closes over (static buffers), exactly as a device graph does. Graphs are for inference:
captures and replays run without autograd. cuda and npu share one implementation
(`graphs.device`: a pool per graph, captures beside live requests); npu adds a graph-count cap
and refuses `TASK_QUEUE_ENABLE=2`. Each backend is built from what the running torch and
torch_npu offer: feature checks, never version strings (each private allocator hook is looked
up under every name it has had, `CUDA_HOOKS`, `NPU_HOOKS`).

An NPU's budget is its streams, not a process's graphs: 2,048 per device, shared by every
process on it, NPU_SPARE_STREAMS of them kept spare (vllm-ascend caps itself alike; past them
capture fails with 207008 "Stream resources are insufficient"), and a graph holds one or more
(piecewise graphs: layers + 1). `npu_graph_cap(streams_per_graph)` is what one process may hold
alone; the processes of a device count what they hold together in its stream ledger
(`graphs.streams`), and a capture the device refuses anyway raises GraphLimit and makes the
backend `full` until a release. torch_npu older than NPU_GRAPHS_SINCE lacks NPU graphs and is
refused with that reason.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.utils._pytree import tree_leaves

from gearshift.errors import BackendUnavailable, ConfigError
from gearshift.graphs.device import DeviceApi, DeviceBackend, MemoryReading
from gearshift.graphs.streams import NPU_BUDGET as NPU_BUDGET
from gearshift.graphs.streams import NPU_SPARE_STREAMS as NPU_SPARE_STREAMS
from gearshift.graphs.streams import NPU_STREAMS as NPU_STREAMS

NPU_LIMIT = (
    "an NPU has 2,048 streams per device, shared by its processes (128 kept spare), and each"
    " graph holds `streams_per_graph` of them (past them capture fails with 207008 'Stream"
    " resources are insufficient'); the workers of a namespace count theirs together in the"
    " device's stream ledger; a profile needs one graph per combination of gears: the"
    " product of its gear counts over its dims"
)


def npu_graph_cap(streams_per_graph: int = 1) -> int:
    """Graphs one process may hold on an NPU alone, `streams_per_graph` a graph (piecewise
    graphs: layers + 1; communication groups more); what the device's other processes hold
    is counted in its stream ledger (`graphs.streams`)."""
    if streams_per_graph < 1:
        raise ConfigError("npu", "streams_per_graph must be at least 1")
    return NPU_BUDGET // streams_per_graph


NPU_MAX_GRAPHS = npu_graph_cap()
NPU_GRAPHS_SINCE = "2.7.1"  # the torch_npu release whose NPUGraph has every API used here


class Graph(Protocol):
    outputs: Any

    def capture(self) -> Any: ...

    def replay(self) -> None: ...

    def reset(self) -> None: ...


class Backend(Protocol):
    """`max_graphs`: the most graphs the device may hold (None: no cap), `limit_reason` why."""

    kind: str
    index: int
    max_graphs: int | None
    limit_reason: str

    def graph(self, fn: Callable[[], Any]) -> Graph: ...

    def synchronize(self) -> None: ...

    def collect(self) -> bool:
        """Give the memory of reset graphs back to the device; False if it could not."""

    def mem_get_info(self) -> MemoryReading: ...


class CpuGraph:
    """A simulated graph: replay re-runs `fn` and writes its result into the captured outputs
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
    max_graphs: int | None = None
    limit_reason = ""

    def __init__(
        self, index: int = 0, memory: MemoryReading | Callable[[], MemoryReading] | None = None
    ) -> None:
        self.index = index
        self.memory = memory

    def graph(self, fn: Callable[[], Any]) -> CpuGraph:
        return CpuGraph(fn)

    def synchronize(self) -> None:
        pass

    def collect(self) -> bool:
        return True  # a cpu graph's memory goes with its tensors

    def mem_get_info(self) -> MemoryReading:
        if self.memory is None:
            page = os.sysconf("SC_PAGE_SIZE")
            return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page
        return self.memory() if callable(self.memory) else self.memory


def get_backend(kind: str = "cpu", index: int = 0) -> Backend:
    """The process-wide backend of one device; BackendUnavailable says what is missing."""
    return _backend(kind, index)


@functools.cache
def _backend(kind: str, index: int) -> Backend:
    if kind == "cpu":
        return CpuBackend(index)
    if kind == "cuda":
        return cuda_backend(index)
    if kind == "npu":
        return npu_backend(index)
    raise ConfigError("backend", f"unknown backend {kind!r}; expected cpu, cuda or npu")


# Each private hook under every name it has had, newest first: a torch or torch_npu offers one.
CUDA_HOOKS = {
    "end_allocate": ("_cuda_endAllocateToPool", "_cuda_endAllocateCurrentStreamToPool"),
    "release_pool": ("_cuda_releasePool",),
    "clear_workspaces": ("_cuda_clearCublasWorkspaces",),
}
NPU_HOOKS = {  # torch_npu for torch 2.13 renamed the first (torch_npu/csrc/npu/Module.cpp)
    "end_allocate": ("_npu_endAllocateToPool", "_npu_endAllocateCurrentStreamToPool"),
    "release_pool": ("_npu_releasePool",),
}


def hooks(module: Any, names: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """The hooks `module` has, by role: the first of each role's names it offers, else None."""
    return {role: next((getattr(module, n) for n in ns if hasattr(module, n)), None)
            for role, ns in names.items()}


def check_allocator(cuda: Any) -> None:
    """BackendUnavailable unless the caching allocator is torch's native one: the
    `cudaMallocAsync` backend (`PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync`) allows one
    capture at a time in a process and keeps no graph pools, so a graph's memory can be neither
    counted (`memory_reserved` does not show it) nor given back by a release."""
    backend = getattr(cuda, "get_allocator_backend", lambda: "native")()
    if backend != "native":
        raise BackendUnavailable(
            f"cuda: the {backend} allocator backend is in use; gearshift's graphs need torch's"
            " native caching allocator (a private pool per graph, counted and given back on"
            " release): unset `backend:cudaMallocAsync` in PYTORCH_CUDA_ALLOC_CONF"
        )


def _prime_cuda() -> None:
    """The current thread's cuBLAS workspace on the current stream (`current_blas_handle`
    makes it, no kernel), and its cuBLASLt one (one tiny bias GEMM, the Lt path)."""
    torch.cuda.current_blas_handle()
    a = torch.ones(8, 8, device="cuda", dtype=torch.bfloat16)
    torch.addmm(a[0], a, a)


def cuda_api(cuda: Any = None) -> DeviceApi:
    """What the cuda backend uses of `cuda` (torch.cuda): the recovery hooks by any of their
    names, and the "kept" workspace design where `MemPool` and `use_mem_pool` exist."""
    cuda = torch.cuda if cuda is None else cuda
    found = hooks(torch._C, CUDA_HOOKS)
    kept = all(hasattr(cuda, n) for n in ("MemPool", "use_mem_pool", "current_blas_handle"))
    extra = (cuda.MemPool, cuda.use_mem_pool, _prime_cuda) if kept else (None, None, None)
    return DeviceApi("cuda", cuda, cuda.CUDAGraph, found["end_allocate"], found["release_pool"],
                     found["clear_workspaces"], *extra)


def cuda_backend(index: int) -> DeviceBackend:
    """A new backend of CUDA device `index` (`get_backend` keeps one per device):
    BackendUnavailable without a device or with the cudaMallocAsync allocator backend."""
    if not torch.cuda.is_available():
        raise BackendUnavailable("cuda: torch.cuda is not available (no GPU or a CPU-only torch)")
    _check_index("cuda", index, torch.cuda.device_count())
    check_allocator(torch.cuda)
    return DeviceBackend(cuda_api(), index)


def npu_backend(index: int, streams_per_graph: int = 1) -> DeviceBackend:
    """A new backend of NPU `index`, its graphs capped by `npu_graph_cap` and counted in the
    device's stream ledger (`graphs.streams`, once `connect()` installed it):
    BackendUnavailable without torch_npu and a device, with a torch_npu older than NPU graphs,
    or with `TASK_QUEUE_ENABLE=2` (NPU capture refuses it)."""
    try:
        import torch_npu  # registers torch.npu
    except (ImportError, OSError, RuntimeError) as e:
        raise BackendUnavailable(
            "npu: torch_npu cannot be imported (install the `npu` extra and source the"
            f" Ascend CANN toolkit's set_env.sh): {e}"
        ) from e
    npu = torch.npu
    missing = [n for n in ("NPUGraph", "graph_pool_handle") if not hasattr(npu, n)]
    if missing:
        raise BackendUnavailable(
            f"npu: torch_npu {getattr(torch_npu, '__version__', '?')} has no torch.npu."
            f"{' or '.join(missing)}: NPU graphs need torch_npu >= {NPU_GRAPHS_SINCE}"
        )
    if os.environ.get("TASK_QUEUE_ENABLE", "").strip() == "2":
        raise BackendUnavailable(
            "npu: TASK_QUEUE_ENABLE=2, which NPU graph capture refuses (NPUGraph::capture_begin);"
            " export TASK_QUEUE_ENABLE=1 (or 0) before starting the worker"
        )
    if not npu.is_available():
        raise BackendUnavailable("npu: torch_npu sees no NPU (check the CANN driver/toolkit)")
    _check_index("npu", index, npu.device_count())
    found = hooks(torch_npu._C, NPU_HOOKS)
    api = DeviceApi("npu", npu, npu.NPUGraph, found["end_allocate"], found["release_pool"])
    cap = npu_graph_cap(streams_per_graph)
    return DeviceBackend(api, index, max_graphs=cap, limit_reason=NPU_LIMIT, share_streams=True,
                         streams_per_graph=streams_per_graph)


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
