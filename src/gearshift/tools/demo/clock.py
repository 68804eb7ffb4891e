"""The adaptive run's clock: trace time, as far as the workers have taken the trace.

The embedded controller and every worker's client read it, so events are stamped, windows
decay and decision rounds fall in trace time (over the time compression), as in the
simulator, however fast or slow the workers go: a slower run (a loaded machine, captures)
does not get more rounds over fewer events each.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


class TraceClock:
    """CLOCK_MONOTONIC until the run starts (`origin.value` 0); then `origin.value` plus the
    compressed trace time `times[i]` of the last row taken (`queue.value` is the next one).
    `origin` and `queue` are shared `multiprocessing.Value`s: `origin` is set once, when the
    run starts, to CLOCK_MONOTONIC then (so time never goes back); `queue` only grows while
    the clock is read. Reads take no lock: each value is one aligned 8-byte word, read whole,
    and every request reads the clock while the workers take rows under the queue's lock.
    `sleep` waits wall time."""

    def __init__(self, times: np.ndarray, origin: Any, queue: Any) -> None:
        assert len(times) and np.all(np.diff(times) >= 0), "trace times, non-decreasing"
        self._times_ns = np.round(times * 1e9).astype(np.int64).tolist()
        self.origin, self.queue = _unlocked(origin), _unlocked(queue)
        self._origin_ns = 0  # origin.value in ns, once read set

    def now(self) -> float:
        """The clock's time in seconds (`now_ns`)."""
        return self.now_ns() / 1e9

    def now_ns(self) -> int:
        """The clock's time in ns (the class docstring): the request path's stamp, one read of
        each value, no float."""
        origin = self._origin_ns or self._set_origin()
        if not origin:
            return time.monotonic_ns()
        taken = self.queue.value
        times = self._times_ns
        return origin + times[taken - 1 if 0 < taken <= len(times) else (0 if taken < 1 else -1)]

    def _set_origin(self) -> int:
        self._origin_ns = round(self.origin.value * 1e9)  # set once, never changed after
        return self._origin_ns

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


def _unlocked(value: Any) -> Any:
    """A synchronized `Value`'s own ctypes object (read without the lock); others as they are."""
    return value.get_obj() if hasattr(value, "get_obj") else value
