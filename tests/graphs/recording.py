"""A cpu backend that records what it is asked to capture, in order, for tests of capture
order through the public Backend protocol."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gearshift.graphs.backends import CpuBackend, CpuGraph


class RecordingBackend(CpuBackend):
    """`captured`: the output shape of each graph captured (a tensor-valued fn), in order."""

    def __init__(self) -> None:
        super().__init__()
        self.captured: list[tuple[int, ...]] = []

    def graph(self, fn: Callable[[], Any]) -> CpuGraph:
        captured = self.captured

        class Recorded(CpuGraph):
            def capture(self) -> Any:
                out = super().capture()
                captured.append(tuple(out.shape))
                return out

        return Recorded(fn)
