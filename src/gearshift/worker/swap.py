"""The client's swap thread: a daemon thread that runs `tick` every `interval()` seconds, or at
once when woken, until stopped (with `background=False` no thread runs: the owner calls `tick`
itself). A tick that returns False (it left nothing to do: the client's is attached, every
profile answered by the controller and settled) is followed by a wait of
IDLE_INTERVALS intervals instead: an idle worker's thread wakes twice a second, not 20 times,
and whatever gives it work (a request that sees a new snapshot or wants a graph not captured,
drained gears, an attached runner) wakes it at once. A tick that raises is handed to `failed`
and the loop goes on: nothing the thread meets reaches the request path."""

from __future__ import annotations

import threading
from collections.abc import Callable

from gearshift import threads

IDLE_INTERVALS = 10  # an idle tick's wait, in intervals (20 Hz -> 2 Hz at the default 50 ms)


class SwapThread:
    """`start()` it (again, or after `stop()`: nothing); `wake()` runs the next tick now."""

    def __init__(self, tick: Callable[[], bool | None], interval: Callable[[], float],
                 failed: Callable[[Exception], None], background: bool = True) -> None:
        self._tick, self._interval, self._failed = tick, interval, failed
        self.background = background
        self._wake, self._stop = threading.Event(), threading.Event()
        self.thread: threading.Thread | None = None

    def start(self) -> None:
        if self.background and self.thread is None and not self._stop.is_set():
            self.thread = threading.Thread(target=self._run, name="gearshift-swap", daemon=True)
            threads.start(self.thread)

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float) -> None:
        """Stop the loop and wait at most `timeout` seconds for the thread to end."""
        self._stop.set()
        self._wake.set()
        if self.thread is not None:
            self.thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            busy = True
            try:
                busy = self._tick() is not False
            except Exception as e:
                self._failed(e)
            self._wake.wait(self._interval() * (1 if busy else IDLE_INTERVALS))
            self._wake.clear()
