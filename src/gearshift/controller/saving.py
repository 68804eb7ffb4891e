"""When the controller saves its state file: at a bounded rate, written off the loop.

`Saver.request()` marks the state changed (a round's changes, new measurements; a new profile
is saved on the loop before its reply instead); `poll(now)`, every loop iteration, starts a
save once the state changed, no write is in flight and `interval` seconds have passed since the
last save began. The loop only takes the snapshot (`statefile.snapshot`: gears copied,
statistics frozen by reference); one writer thread encodes, writes, fsyncs and renames it
(`statefile.write`), so the loop never waits on the disk (it shares the interpreter lock with
the encoding, a few ms at a time). A write that failed is reported at the next `poll`
(`failed`) and the state stays changed, so the next interval retries it. `wait()` returns once
no write is in flight (before a save on the loop, so that no older snapshot lands after it);
`close()` ends the thread.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gearshift.clock import Clock
from gearshift.controller import statefile
from gearshift.controller.costbook import CostBook
from gearshift.core.round import DeviceLedger


class Saver:
    """Saves of one state directory (module docstring); `seconds` holds recent writes'
    durations (encode, write, fsync, rename, in the writer thread), `loop_seconds` the loop's
    part of them (the snapshot and handing it over)."""

    def __init__(self, directory: Path, devices: Mapping[int, DeviceLedger], costs: CostBook,
                 interval: float, clock: Clock, failed: Callable[[Exception], None]) -> None:
        self.directory, self.devices, self.costs, self.clock = directory, devices, costs, clock
        self.interval, self.failed = interval, failed
        self.changed = False
        self.saves = 0  # writes the writer thread completed
        self.seconds: deque[float] = deque(maxlen=64)
        self.loop_seconds: deque[float] = deque(maxlen=64)
        self._began = -float("inf")  # when the last save began (the caller's clock)
        self._pending: Future[float] | None = None
        self._pool: ThreadPoolExecutor | None = None

    def request(self) -> None:
        """The state changed: save it within `interval` (at the next `poll` after that)."""
        self.changed = True

    def saved(self, now: float) -> None:
        """A save of the current state just completed on the caller's side (at `now`)."""
        self.changed = False
        self._began = now

    def poll(self, now: float) -> None:
        """Report a finished write; start the next one when one is due."""
        self._collect()
        if not self.changed or self._pending is not None or now < self._began + self.interval:
            return
        began = self.clock.now()
        tree = statefile.snapshot(dict(self.devices), self.costs)
        self.changed, self._began = False, now
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="gearshift-save")
        self._pending = self._pool.submit(_write, self.directory, tree, self.clock)
        self.loop_seconds.append(self.clock.now() - began)

    def wait(self) -> None:
        """Until no write is in flight (its failure is reported as `poll` does)."""
        if self._pending is not None:
            self._pending.exception()  # waits
            self._collect()

    def close(self) -> None:
        """Wait for a write in flight, then end the writer thread (idempotent)."""
        self.wait()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    def _collect(self) -> None:
        if self._pending is None or not self._pending.done():
            return
        done, self._pending = self._pending, None
        error = done.exception()
        if error is None:
            self.saves += 1
            self.seconds.append(done.result())
        else:
            self.changed = True  # retried at the next interval
            self.failed(error if isinstance(error, Exception) else RuntimeError(repr(error)))


def _write(directory: Path, tree: dict[str, Any], clock: Clock) -> float:
    began = clock.now()
    statefile.write(directory, tree)
    return clock.now() - began
