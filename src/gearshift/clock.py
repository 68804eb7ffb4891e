"""Injected time: every component takes a clock instead of calling `time.*`.

Times are seconds on CLOCK_MONOTONIC, shared by all processes of a host.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def now_ns(self) -> int: ...

    def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """The host's CLOCK_MONOTONIC, in seconds."""

    def now(self) -> float:
        return time.monotonic()

    now_ns = staticmethod(time.monotonic_ns)  # a C call: no Python frame on the hot path

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class WallClock:
    """The wall clock (`time.time`), in seconds since the epoch: the one time that means the
    same on every host (a fleet's publish times); never for durations on one host."""

    def now(self) -> float:
        return time.time()

    now_ns = staticmethod(time.time_ns)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class ThreadCpuClock:
    """The calling thread's CPU seconds (`time.thread_time`): what a graph costs on the cpu,
    where wall time would also count the other processes' share of the cores. Torch's
    intra-op pool threads are not the caller: exact with one intra-op thread, as the demo's
    workers run. `sleep` is the wall clock's (CPU time does not pass while asleep)."""

    now = staticmethod(time.thread_time)
    now_ns = staticmethod(time.thread_time_ns)

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class ManualClock:
    """Virtual time that moves only when told: `sleep` and `advance` move `now` at once;
    thread-safe. The stress harness steps a controller on it (tools/stress/target.py); the
    tests name it FakeClock (tests/fakeclock.py)."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def now_ns(self) -> int:
        return round(self.now() * 1e9)

    def sleep(self, seconds: float) -> None:
        self.advance(max(0.0, seconds))

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
