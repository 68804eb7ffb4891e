"""How the adaptive runner captures one variant: its graph, the padding probe, its measurement.

`Capturing` is mixed into `AdaptiveRunner` (`graphs.adaptive`), whose state it uses (the
transform, the meter, the backend and pool, the prober, the static buffers, the replay section,
the unbound inputs' buffers, the counts). `_capture(gears)` records the variant's graph on the
static views of its gears, runs the padding probe on it (`graphs.probe`: once per gear) and
measures it (`graphs.measure`): what adding it cost, the probe included, and its replay. On the
cpu a capture runs the function once, as a replay does: when a probe is due that run is on the
probe's padded input, under the replay section (the buffers are requests' too), and its result
is what the probe compares (`folds_probe`), so a cpu capture is one run of the gear and the
probe's eager run on about half its rows; that run is also timed as the graph's replay. A
subclass whose capture does more, which no request may wait for (a compile), sets `folds_probe`
False: it captures outside the section and the probe replays the graph.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from gearshift.core.dims import Variant
from gearshift.graphs import plans
from gearshift.graphs.backends import Graph
from gearshift.graphs.buffers import StaticBuffers
from gearshift.graphs.measure import Meter
from gearshift.graphs.pool import GraphResourcePool
from gearshift.graphs.probe import Prober
from gearshift.graphs.transform import Chunk, Transform

# a probe the capture ran (its chunk and inputs, `Prober.due`) and its result, cut back
Ran = tuple[tuple[Chunk, dict[str, torch.Tensor]], list[torch.Tensor]]
log = logging.getLogger("gearshift.graphs.adaptive")  # the runner's log: a refusal is its


@dataclass(frozen=True)
class Captured:
    """One variant's graph and what its replays read and write."""

    inputs: dict[str, torch.Tensor]  # views of the static buffers at the variant's gears
    graph: Graph
    leaves: list[torch.Tensor]  # the graph's outputs, checked at capture, rewritten by replays
    spec: Any  # their pytree structure
    lengths: dict[str, torch.Tensor]  # its own lengths inputs, set before each replay
    key: int  # its key in the pool (`GraphResourcePool.register`), by which it is released


class Capturing:
    """`AdaptiveRunner`'s capture of one variant (the module docstring)."""

    # On the cpu a capture runs fn once, as a replay: on the probe's input when one is due
    # (`_capture_run`). Not where a capture does more that requests must not wait for.
    folds_probe = True
    transform: Transform
    names: tuple[str, ...]
    device: torch.device
    meter: Meter
    backend: Any
    pool: GraphResourcePool
    stats: dict[str, int]
    refused: str | None
    _prober: Prober
    _staged: StaticBuffers
    _section: Any
    _unbound: dict[str, torch.Tensor]
    _count_lock: threading.Lock

    def _graph_fn(self, gears: Variant, inputs: dict[str, torch.Tensor],
                  lengths: dict[str, torch.Tensor]) -> Callable[[], Any]:
        raise NotImplementedError

    def _load_unbound(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Copy a call's unbound inputs into their static buffers (under the replay section:
        every graph reads them)."""
        for name, buffer in self._unbound.items():
            buffer.copy_(tensors[name])

    def _capture(self, gears: Variant) -> Captured | None:
        """One variant's graph, measured; None if it failed the padding check (`refused`)."""
        inputs = self._staged.views(gears)
        at = dict(zip(self.names, gears, strict=True))
        lengths = {n: torch.tensor([at[d]], device=self.device)
                   for n, d in self.transform.lengths.items()}
        began = self.meter.now()
        graph = None
        timed: list[float] | None = [] if self.meter.runs_fn else None
        try:
            graph = self.backend.graph(self._graph_fn(gears, inputs, lengths))
            ran = None  # the probe's result, when the capture's run was the probe's
            if timed is not None and self.folds_probe:
                leaves, spec, ran = self._capture_run(graph, gears, inputs, lengths, timed)
            else:
                leaves, spec = self.transform.leaves(graph.capture())
            captured = Captured(inputs, graph, leaves, spec, lengths, -1)
            why = self._check_graph(gears, captured, timed, ran)
            ended = self.meter.now()  # the probe is part of what adding the graph costs
        except BaseException:
            with self._count_lock:
                self.stats["capture_failures"] += 1
            if graph is not None:
                graph.reset()  # a captured graph of unexpected outputs holds memory too
            self.backend.collect()
            raise
        if why is not None:
            graph.reset()
            self.backend.collect()
            self.refused = why
            log.warning("%s; every call runs eagerly on its unpadded inputs from now on", why)
            return None
        captured = dataclasses.replace(captured, key=self.pool.register(graph))
        self.meter.keep(at, self.meter.cost(graph, began, ended, leaves, timed or ()))
        return captured

    def _capture_run(self, graph: Any, gears: Variant, inputs: dict[str, torch.Tensor],
                     lengths: dict[str, torch.Tensor], timed: list[float]
                     ) -> tuple[list[torch.Tensor], Any, Ran | None]:
        """A cpu graph's capture, one run of fn, timed as a replay (appended to `timed`): on
        the padding probe's padded input when a probe is due, under the replay section (the
        buffers are requests' too), so that its result, cut back, is what the probe compares
        (the third value: the probe and that result), and no replay is run for it; else on
        whatever the buffers hold."""
        clock, probe = self.meter.clock, self._prober.due(gears)
        if probe is None:
            start = clock.now()
            out = graph.capture()
            timed.append(clock.now() - start)
            return (*self.transform.leaves(out), None)
        chunk, tensors = probe
        with self._section:
            self._load_unbound(tensors)
            self.transform.fill(inputs, tensors, chunk)
            for name, dim in self.transform.lengths.items():
                lengths[name].fill_(chunk[dim].size)
            start = clock.now()
            out = graph.capture()
            timed.append(clock.now() - start)
            leaves, spec = self.transform.leaves(out)
            return leaves, spec, (probe, self.transform.cut(leaves, chunk, copy=True))

    def _check_graph(self, gears: Variant, captured: Captured, timed: list[float] | None = None,
                     ran: Ran | None = None) -> str | None:
        """Why the new graph of `gears` fails the padding probe (`Prober.check`), or None;
        the probe's replay, timed on the meter's clock, is appended to `timed` if given; `ran`:
        the probe and its result already (`_capture_run`), and no replay."""

        @torch.no_grad()
        def replay(chunk: Chunk, tensors: dict[str, torch.Tensor]) -> list[torch.Tensor]:
            if ran is not None:
                return ran[1]
            with self._section:  # the buffers: requests' too
                self._load_unbound(tensors)
                start = self.meter.clock.now() if timed is not None else 0.0
                out = plans.replay(self.transform, captured, tensors, chunk)
                if timed is not None:
                    timed.append(self.meter.clock.now() - start)
                return out

        return self._prober.check(gears, replay, None if ran is None else ran[0])
