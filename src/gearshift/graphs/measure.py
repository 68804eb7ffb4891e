"""Measuring each graph as it is captured, on the capturing (warm-up) thread, never a request's.

A graph's cost (`GraphCost`) is what `core.costs.Measurement` holds for each of its gears:
- capture seconds: what adding the graph took its worker: `graph.capture()` (its warm-up runs
  and the recording) and the runner's padding probe (an eager run and a padded replay,
  `graphs.probe`) between two synchronizes of the backend, so the device's work is in it on
  cuda and npu, and the timed replays below (on the cpu one replay is as long as the capture);
- graph bytes: what the graph alone holds: on cuda and npu what the allocator reserved for
  its own pool while recording (`DeviceGraph.pool_bytes`: its intermediates, outputs and
  cuBLAS workspace; another thread's allocation in that window counts too), on the cpu its
  outputs. Its inputs are views of the runner's static buffers, shared by all its graphs and
  sized by the largest gear whichever gears are held: no graph's bytes;
- replay seconds: the median of `replays` replays, each synchronised (a device graph's on its
  own stream, after the replays before it: `DeviceGraph.timed_replay`), made before the graph
  serves any request (its outputs are its own; it reads the shared static inputs only):
  REPLAYS on a device, CPU_REPLAYS on the cpu, where a replay re-runs the function and so
  costs a capture; there a run of the whole gear that adding the graph made anyway counts as
  one (`runs_fn`: the capture's run, `graphs.capturing`; a compiled runner's probe replay), so
  a cpu graph runs no replay of its own.

Seconds are the meter's clock (`clock_for`): on a device the monotonic clock, on the cpu the
measuring thread's CPU time, so that what other processes run meanwhile does not bend the
fitted curves. Measuring never raises: a synchronize or a timed replay that fails leaves the
graph unmeasured (`Meter.failures`, logged once) and the capture stands.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gearshift.clock import Clock, MonotonicClock, ThreadCpuClock

log = logging.getLogger(__name__)
REPLAYS = 3  # timed replays per device graph: the median of three, cheap beside a capture
CPU_REPLAYS = 1  # per cpu graph: each re-runs the function, as long as the capture itself
MAX_KEPT = 4096  # graph costs kept until taken (the oldest go first)


def _on_cpu(backend: Any) -> bool:
    return getattr(backend, "kind", "") == "cpu"


def replays_for(backend: Any) -> int:
    """How many replays of a graph of `backend` are timed by default."""
    return CPU_REPLAYS if _on_cpu(backend) else REPLAYS


def clock_for(backend: Any) -> Clock:
    """What times a graph of `backend` by default: on the cpu the measuring thread's CPU
    seconds (a graph's cost there is the CPU it takes; the wall clock would count other
    load, which differs between a start-up capture and one made while requests run), on a
    device the monotonic clock between two synchronizes."""
    return ThreadCpuClock() if _on_cpu(backend) else MonotonicClock()


@dataclass(frozen=True)
class GraphCost:
    """One captured graph, measured: seconds to warm up, capture and time it, device bytes it
    holds, seconds of one replay."""

    capture_seconds: float
    graph_bytes: int
    replay_seconds: float


class Meter:
    """Times captures and replays on one backend (`synchronize()`) with `clock`."""

    def __init__(self, backend: Any, clock: Clock | None = None, replays: int = REPLAYS) -> None:
        self.backend, self.clock, self.replays = backend, clock or clock_for(backend), replays
        self.runs_fn = _on_cpu(backend)  # a capture or a replay runs fn, timed as one (above)
        self.failures = 0
        self._kept: deque[tuple[dict[str, int], GraphCost]] = deque(maxlen=MAX_KEPT)

    def keep(self, variant: dict[str, int], cost: GraphCost | None) -> None:
        """Keep a graph's cost (None: unmeasured, nothing kept) until `take`n; the oldest go
        first beyond MAX_KEPT."""
        if cost is not None:
            self._kept.append((variant, cost))

    def take(self) -> list[tuple[dict[str, int], GraphCost]]:
        """The costs kept since the last call, oldest first (per graph: dim -> gear)."""
        out = []
        while self._kept:
            out.append(self._kept.popleft())
        return out

    def now(self) -> float | None:
        """The clock once the device is idle; None (counted) if it could not synchronize."""
        try:
            self.backend.synchronize()
        except Exception as e:
            self._failed("synchronize", e)
            return None
        return self.clock.now()

    def cost(self, graph: Any, began: float | None, ended: float | None,
             outputs: Iterable[Any], probed: Sequence[float] = ()) -> GraphCost | None:
        """The cost of `graph`, captured from `began` to `ended` (None: untimed), its bytes
        (its pool's, else those of its `outputs`) and its replays: those timed between `began`
        and `ended` (`probed`: runs of the whole gear, `runs_fn`) and as many more timed now as
        make `replays`; None if unmeasured."""
        if began is None or ended is None or self.replays < 1:
            return None
        times: list[float] = []
        try:
            for _ in range(self.replays - len(probed)):
                timed = getattr(graph, "timed_replay", None)  # a device graph's: its stream's
                if timed is not None:  # syncs, not the device's (others' queued work)
                    times.append(timed(self.clock))
                    continue
                start = self.now()
                if start is None:
                    return None
                graph.replay()
                end = self.now()
                if end is None:
                    return None
                times.append(end - start)
        except Exception as e:
            self._failed("replay", e)
            return None
        held = getattr(graph, "pool_bytes", None)  # the outputs are in the pool already
        nbytes = static_bytes(outputs) if held is None else held
        return GraphCost(max(ended - began, 0.0) + max(sum(times), 0.0), max(int(nbytes), 0),
                         max(statistics.median([*probed, *times]), 0.0))

    def _failed(self, what: str, error: Exception) -> None:
        self.failures += 1
        if self.failures == 1:
            log.warning("measuring a graph failed (%s: %r); it is kept, unmeasured, and later"
                        " failures are not logged", what, error)


def static_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the tensors among `tensors` (views count their own elements)."""
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
