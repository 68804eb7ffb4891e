"""When the controller saves its state file: at a bounded rate, written off the loop.

`Saver.request()` marks the state changed (a round's changes, new measurements; a new profile
is saved on the loop before its reply instead); `poll(now)`, every loop iteration, starts a
save once the state changed, no write is in flight and `interval` seconds have passed since the
last save began. The loop only takes the snapshot (`statefile.snapshot`: gears copied,
statistics frozen by reference); a writer thread encodes, writes, fsyncs and renames it
(`statefile.write`), so the loop never waits on the disk (it shares the interpreter lock with
the encoding, a few ms at a time). A write that failed is reported at the next `poll`
(`failed`) and the state stays changed, so the next interval retries it. A save on the loop
(`save_now`: a new profile before its reply, the start, the stop) that fails marks the state
changed alike: the next `poll` retries it off the loop, every `interval`, until one succeeds.
From the first failed save until the next that succeeds, `unsaved_since` holds when that
failure happened (the caller's clock): the status document and the metrics show it ("state
unsaved since ..."), since a crash then loses what changed. `wait()` returns once no write is
in flight (before a save on the loop, so that no older snapshot lands after it); so does
`close()`.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
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
        self.unsaved_since: float | None = None  # the first failed save since the last good one
        self.saves = 0  # writes the writer thread completed
        self.seconds: deque[float] = deque(maxlen=64)
        self.loop_seconds: deque[float] = deque(maxlen=64)
        self._began = -float("inf")  # when the last save began (the caller's clock)
        self._measured = 0  # the cost book's measurements when the last save began
        self._pending: _Write | None = None

    def request(self) -> None:
        """The state changed: save it within `interval` (at the next `poll` after that)."""
        self.changed = True

    def after_round(self, changed: bool) -> None:
        """A decision round ran: the state changed if it `changed` something or measurements
        arrived since the last save."""
        if changed or self.costs.counts["measured"] != self._measured:
            self.request()

    def saved(self, now: float, measured: int) -> None:
        """A save of the current state (`measured`: the book's count then) completed on the
        caller's side at `now`."""
        self.changed, self._began, self._measured = False, now, measured
        self.unsaved_since = None

    def save_now(self) -> None:
        """Save on the caller's thread, after any write in flight; a failure raises, and the
        state stays changed for `poll` to save again (`unsaved_since` set)."""
        self.wait()
        measured = self.costs.counts["measured"]
        try:
            statefile.save(self.directory, self.devices, self.costs)
        except BaseException:
            self._unsaved()
            raise
        self.saved(self.clock.now(), measured)

    def _unsaved(self) -> None:
        self.changed = True
        if self.unsaved_since is None:
            self.unsaved_since = self.clock.now()

    def poll(self, now: float) -> None:
        """Report a finished write; start the next one when one is due."""
        self._collect()
        if not self.changed or self._pending is not None or now < self._began + self.interval:
            return
        began, measured = self.clock.now(), self.costs.counts["measured"]
        tree = statefile.snapshot(dict(self.devices), self.costs)
        self.changed, self._began, self._measured = False, now, measured
        self._pending = _Write(self.directory, tree, self.clock)
        self._pending.start()
        self.loop_seconds.append(self.clock.now() - began)

    def wait(self) -> None:
        """Until no write is in flight (its failure is reported as `poll` does)."""
        if self._pending is not None:
            self._pending.join()
            self._collect()

    def close(self) -> None:
        """Wait for a write in flight (idempotent)."""
        self.wait()

    def _collect(self) -> None:
        if self._pending is None or self._pending.is_alive():
            return
        done, self._pending = self._pending, None
        if done.error is None:
            self.saves += 1
            self.seconds.append(done.seconds)
            self.unsaved_since = None  # saves work again: what is left is the usual wait
        else:
            self._unsaved()  # retried at the next interval
            self.failed(done.error)


class _Write(threading.Thread):
    """One save in its own thread (a daemon: a process that exits without `close` leaves at
    most a temp file, which the next `StateLock.acquire` removes; the rename is atomic)."""

    def __init__(self, directory: Path, tree: dict[str, Any], clock: Clock) -> None:
        super().__init__(name="gearshift-save", daemon=True)
        self.directory, self.tree, self.clock = directory, tree, clock
        self.seconds = 0.0
        self.error: Exception | None = None

    def run(self) -> None:
        began = self.clock.now()
        try:
            statefile.write(self.directory, self.tree)
        except BaseException as e:  # whatever it is, the loop reports it and saves again
            self.error = e if isinstance(e, Exception) else RuntimeError(repr(e))
        self.seconds = self.clock.now() - began
        self.tree = {}  # its statistics' memory goes now, not at the next save
