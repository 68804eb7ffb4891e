"""The tests' clock: virtual time that `sleep` and `advance` move at once; thread-safe.

Tests inject it wherever a component takes a `Clock` (never patching `time.*`).
"""

from __future__ import annotations

import threading


class FakeClock:
    """Virtual time for tests: `sleep` advances `now` instantly; thread-safe."""

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
