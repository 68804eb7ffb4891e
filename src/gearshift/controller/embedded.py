"""The embedded controller: one run in a daemon thread of a worker process (`start`; for
`connect(embedded=True)`, `start_default`): the same loop and shared memory as `gearshift serve`.

`start_default` keeps its state file in the given directory, else `GEARSHIFT_STATE_DIR`, else in a
temporary directory (`scratch_prefix`) removed when it stops; it returns None when another live
controller won the race to the namespace. `stop()` ends the loop gracefully (final drain, state
saved); the final save's failure, logged already by the loop, is kept in `error` rather than
lost with the thread. Both belong to the process that started them: a forked child's copy stops
and removes nothing (no finalizer removes the directory, as a TemporaryDirectory's would).

SIGTERM, whose default action kills the process without running its exit handlers, would
leave the namespace's segments in /dev/shm and the temporary state directory behind. So while
an embedded controller runs, made on the main thread of a process that left SIGTERM at its
default, SIGTERM raises SystemExit(128 + SIGTERM) in the main thread instead: the stack
unwinds and the exit handlers close the clients, stop the controller and remove both; `stop`
puts the default back. A process killed harder (SIGKILL) leaves them: `gearshift cleanup`
removes the segments and, with `remove_scratch`, the dead embedded controllers' temporary
state directories (`gearshift-<namespace>-XXXXXXXX` in the temporary directory, each removed
only once its state lock is free: `statefile.remove_state`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from gearshift import environment, threads
from gearshift.controller.config import ControllerConfig
from gearshift.core.config import PolicyConfig
from gearshift.errors import ControllerRunning, GearshiftError, StateError

if TYPE_CHECKING:
    from gearshift.controller.controller import Controller

__all__ = ["EmbeddedController", "remove_scratch", "scratch_prefix", "start", "start_default"]
log = logging.getLogger(__name__)


class Loop(Protocol):
    """What the thread runs: a loop that ends, closed, once `stop` is set."""

    def run(self, stop: threading.Event) -> None: ...


L = TypeVar("L", bound=Loop)


def _terminated(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


class EmbeddedController(Generic[L]):
    """A controller running in a daemon thread of a worker process (`connect(embedded=True)`)."""

    def __init__(self, controller: L, scratch: str | None = None) -> None:
        self.controller, self.scratch, self.pid = controller, scratch, os.getpid()
        self._stop = threading.Event()
        self.error: StateError | None = None  # the final save's failure (logged already)
        self._sigterm = _install()
        self._thread = threading.Thread(target=self._run, name="gearshift-controller",
                                        daemon=True)
        threads.start(self._thread)

    def _run(self) -> None:
        try:
            self.controller.run(self._stop)
        except StateError as e:
            self.error = e

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop gracefully (final drain, state saved) and remove the `scratch` directory; False
        if it did not end in `timeout`. A forked child's copy stops and removes nothing."""
        if os.getpid() != self.pid:
            return True  # no thread of it runs here
        try:
            self._stop.set()
            self._thread.join(timeout)
            if self._sigterm:
                self._sigterm = False
                _uninstall()
            return not self._thread.is_alive()
        finally:
            if self.scratch is not None:
                shutil.rmtree(self.scratch, ignore_errors=True)


def start(config: ControllerConfig, policy: PolicyConfig | None = None, *,
          scratch: str | None = None, **options: Any) -> EmbeddedController[Controller]:
    """Open the controller of `config` here (`Controller.open`; errors, e.g. ControllerRunning,
    raise in the caller, `scratch` removed) and run it in a daemon thread of this process. A
    worker should release its slot before `stop()`, so that the final drain takes its ring."""
    from gearshift.controller.controller import Controller

    try:
        return EmbeddedController(Controller.open(config, policy, embedded=True, **options),
                                  scratch)
    except BaseException:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
        raise


def start_default(namespace: str, state_dir: str | None = None) -> EmbeddedController | None:
    """`start` the controller of `namespace` with the default config, its state file in
    `state_dir`, else `GEARSHIFT_STATE_DIR`, else in a temporary directory removed when it
    stops (`connect(embedded=True)`); None if another live controller won the race to it."""
    scratch = None
    state_dir = state_dir or environment.read("state_dir")
    if state_dir is None:
        scratch = state_dir = tempfile.mkdtemp(prefix=scratch_prefix(namespace))
    try:
        return start(ControllerConfig(namespace=namespace, state_dir=state_dir), scratch=scratch)
    except ControllerRunning:
        return None


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
    from gearshift.controller.statefile import remove_state

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
