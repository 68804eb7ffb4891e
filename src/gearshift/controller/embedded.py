"""A controller run in a daemon thread of a worker process (`connect(embedded=True)`,
`Controller.start_embedded`): the same loop and shared memory as `gearshift serve`.

`stop()` ends the loop gracefully (final drain, state saved); the final save's failure, logged
already by the loop, is kept in `error` rather than lost with the thread.

SIGTERM, whose default action kills the process without running its exit handlers, would
leave the namespace's segments in /dev/shm and the temporary state directory behind. So while
an embedded controller runs, made on the main thread of a process that left SIGTERM at its
default, SIGTERM raises SystemExit(128 + SIGTERM) in the main thread instead: the stack
unwinds and the exit handlers close the clients, stop the controller and remove both; `stop`
puts the default back. A process killed harder (SIGKILL) leaves them: `gearshift cleanup`
removes the segments and, with `remove_scratch`, the dead embedded controllers' temporary
state directories (`gearshift-<namespace>-XXXXXXXX` in the temporary directory, each removed
only once its state lock is free: `stateclear.remove_state`).
"""

from __future__ import annotations

import logging
import os
import re
import signal
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Generic, Protocol, TypeVar

from gearshift.errors import GearshiftError, StateError

__all__ = ["EmbeddedController", "remove_scratch", "scratch_prefix"]
log = logging.getLogger(__name__)


class Loop(Protocol):
    """What the thread runs: a loop that ends, closed, once `stop` is set."""

    def run(self, stop: threading.Event) -> None: ...


L = TypeVar("L", bound=Loop)


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


class EmbeddedController(Generic[L]):
    """A controller running in a daemon thread of a worker process (`connect(embedded=True)`)."""

    def __init__(self, controller: L) -> None:
        self.controller = controller
        self._stop = threading.Event()
        self.error: StateError | None = None  # the final save's failure (logged already)
        self._sigterm = _install()
        self._thread = threading.Thread(target=self._run, name="gearshift-controller",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.controller.run(self._stop)
        except StateError as e:
            self.error = e

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop gracefully (final drain, state saved); False if it did not end in `timeout`."""
        self._stop.set()
        self._thread.join(timeout)
        if self._sigterm:
            self._sigterm = False
            _uninstall()
        return not self._thread.is_alive()


def _install() -> bool:
    """SIGTERM -> SystemExit, if this is the main thread and SIGTERM is at its default."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return False  # the process's own handler: it decides how to exit
    signal.signal(signal.SIGTERM, _terminated)
    return True


def _uninstall() -> None:
    if (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGTERM) is _terminated):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def scratch_prefix(namespace: str) -> str:
    """The name prefix of an embedded controller's temporary state directory."""
    return f"gearshift-{namespace}-"


def remove_scratch(namespace: str) -> list[str]:
    """Remove the temporary state directories that dead embedded controllers of `namespace`
    left (this user's, no symlink; one a live controller holds stays); the paths removed."""
    from gearshift.controller.stateclear import remove_state

    pattern = re.compile(re.escape(scratch_prefix(namespace)) + r"[a-z0-9_]{8}")
    root = Path(tempfile.gettempdir())
    removed: list[str] = []
    try:
        entries = sorted(os.scandir(root), key=lambda e: e.name)
    except OSError:
        return removed
    for entry in entries:
        if not pattern.fullmatch(entry.name) or not entry.is_dir(follow_symlinks=False):
            continue
        if entry.stat(follow_symlinks=False).st_uid != os.geteuid():
            continue
        try:
            removed += map(str, remove_state(Path(entry.path), remove_directory=True))
        except (GearshiftError, OSError) as e:  # held by a live controller, or not ours
            log.info("kept %s: %s", entry.path, e)
    return removed
