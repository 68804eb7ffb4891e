"""The controller's state file, from its lock to its removal: what a restarted controller
resumes from (its format: `stateformat`; its directory's checks: `statedir`).

Its life, in order:

- **Lock.** One controller process at a time: `StateLock` holds an exclusive POSIX lock on
  `<state_dir>/gearshift-state.lock` for the controller's life (NamespaceBusy naming the
  holder's pid otherwise; the kernel drops it when the process dies; a process may take it
  again, as it may take its own namespace over), and removes temp files a killed writer left.
- **Restore.** `load` reads the file (`statedir.read`: a regular file of ours, no symlink,
  bounded) and decodes it (`stateformat.decode`); `restore` is the controller's start: a corrupt
  or newer-format file is a StateError, or is set aside as `<file>.corrupt` with a warning when
  asked to start fresh.
- **Save.** `save` (on the caller's thread) and `write` (a tree `stateformat.snapshot` took)
  write the file atomically (`statedir.write_atomic`: temp file, fsync, rename, directory
  fsync), so a reader sees the old or the new file, never a mix, and the rename survives a
  crash. A state over MAX_STATE_BYTES is saved without its statistics, with a warning.
- **Saves while the controller runs.** `Saver` (below) saves at a bounded rate, off the loop.
- **Removal.** `remove_state` (`gearshift cleanup --state`) removes gearshift's own files under
  the lock.

`Saver.request()` marks the state changed (a round's changes, new measurements; a new profile
is saved on the loop before its reply instead); a group round or a change of a group's members
(`groups`) marks it too. `poll(now)`, every loop iteration, starts a save once the state
changed, no write is in flight and `interval` seconds have passed since the last save began.
The loop only takes the snapshot (gears copied, statistics frozen by reference); a writer thread
encodes, writes, fsyncs and renames it (`write`), so the loop never waits on the disk (it shares
the interpreter lock with the encoding, a few ms at a time). A write that failed is reported at
the next `poll` (`failed`) and the state stays changed, so the next interval retries it. A save
on the loop (`save_now`: a new profile before its reply, the start, the stop) that fails marks
the state changed alike: the next `poll` retries it off the loop, every `interval`, until one
succeeds. From the first failed save until the next that succeeds, `unsaved_since` holds when
that failure happened (the caller's clock): the status document and the metrics show it ("state
unsaved since ..."), since a crash then loses what changed. `wait()` returns once no write is
in flight (before a save on the loop, so that no older snapshot lands after it); so does
`close()`.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gearshift import threads
from gearshift.clock import Clock
from gearshift.controller import statedir, stateformat
from gearshift.controller.costbook import CostBook
from gearshift.controller.grouprounds import GroupRounds
from gearshift.core.config import PolicyConfig
from gearshift.core.round import DeviceLedger
from gearshift.errors import NamespaceBusy, StateError, UnsafeStateDir

log = logging.getLogger(__name__)

STATE_FILE = "gearshift-state.msgpack"
LOCK_FILE = "gearshift-state.lock"
CORRUPT_FILE = STATE_FILE + ".corrupt"  # a file that did not load, set aside
TEMP_PREFIX = ".state-"


class StateLock:
    """The exclusive lock of a state directory, held from `acquire` to `release` (the kernel
    releases it when the process dies); see the module docstring."""

    def __init__(self, directory: Path, fd: int) -> None:
        self.directory, self._fd = directory, fd

    @classmethod
    def acquire(cls, directory: Path) -> StateLock:
        """Lock `directory` (created if needed) and remove stale temp files; NamespaceBusy
        naming the pid of another controller holding it."""
        with statedir.opened(directory) as dfd:
            fd = statedir.open_lock(directory, dfd, LOCK_FILE)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                if e.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
                raise NamespaceBusy(
                    f"state directory {directory} is in use by another controller, pid {holder}"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            statedir.remove(dfd, TEMP_PREFIX)  # a writer killed before its rename
        return cls(directory, fd)

    def release(self) -> None:
        """Unlock (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def load(directory: Path, now: float, config: PolicyConfig, costs: CostBook | None = None,
         groups: GroupRounds | None = None) -> dict[int, DeviceLedger]:
    """The saved devices (their measurements into `costs`, their groups into `groups`), or {}
    when there is no state file yet; StateError naming the file."""
    path = directory / STATE_FILE
    with statedir.opened(directory) as dfd:
        blob = statedir.read(directory, dfd, STATE_FILE)
    if blob is None:
        return {}
    try:
        return stateformat.decode(blob, now, config, costs, groups)
    except StateError as e:
        raise StateError(f"{path}: {e}") from None


def restore(directory: Path, now: float, config: PolicyConfig, fresh_on_corrupt: bool,
            costs: CostBook | None = None, groups: GroupRounds | None = None
            ) -> dict[int, DeviceLedger]:
    """`load`; with `fresh_on_corrupt` a file that does not load (StateError) is renamed
    `<file>.corrupt`, with a warning, and the devices (and `costs`, `groups`) start empty."""
    try:
        return load(directory, now, config, costs, groups)
    except StateError as e:
        if not fresh_on_corrupt:
            raise
        with statedir.opened(directory) as dfd:
            statedir.set_aside(dfd, STATE_FILE, CORRUPT_FILE)
        log.warning("%s; starting fresh (the file is kept as %s)", e, directory / CORRUPT_FILE)
        return {}


def save(directory: Path, devices: Mapping[int, DeviceLedger], costs: CostBook | None = None,
         groups: GroupRounds | None = None) -> Path:
    """Write the state file (and `costs`' measurements, `groups`' members) atomically, on the
    caller's thread; returns its path."""
    return write(directory, stateformat.snapshot(devices, costs, groups))


def write(directory: Path, tree: dict[str, Any]) -> Path:
    """Pack a `stateformat.snapshot` and write it atomically, both in the caller's thread;
    returns the file's path."""
    blob = stateformat.packed(tree)
    if len(blob) > statedir.MAX_STATE_BYTES:  # gears, versions and costs outlive statistics
        log.warning("the state is %d bytes, over the %d a state file may hold: saved without "
                    "its statistics (they restart empty, as after a reboot)", len(blob),
                    statedir.MAX_STATE_BYTES)
        blob = stateformat.packed(stateformat.without_statistics(tree))
    with statedir.opened(directory) as dfd:
        statedir.write_atomic(directory, dfd, STATE_FILE, blob, TEMP_PREFIX)
    return directory / STATE_FILE


class Saver:
    """Saves of one state directory (module docstring); `groups`: the group rounds whose groups
    are saved too (None: none). `seconds` holds recent writes' durations (encode, write,
    fsync, rename, in the writer thread), `loop_seconds` the loop's part of them (the snapshot
    and handing it over)."""

    def __init__(self, directory: Path, devices: Mapping[int, DeviceLedger], costs: CostBook,
                 interval: float, clock: Clock, failed: Callable[[Exception], None],
                 groups: GroupRounds | None = None) -> None:
        self.directory, self.devices, self.costs, self.clock = directory, devices, costs, clock
        self.interval, self.failed, self.groups = interval, failed, groups
        self.changed = False
        self.unsaved_since: float | None = None  # the first failed save since the last good one
        self.saves = 0  # writes the writer thread completed
        self.seconds: deque[float] = deque(maxlen=64)
        self.loop_seconds: deque[float] = deque(maxlen=64)
        self._began = -float("inf")  # when the last save began (the caller's clock)
        self._measured = 0  # the cost book's measurements when the last save began
        self._grouped: object = self._groups_now()  # the groups when the last save began
        self._pending: _Write | None = None

    def request(self) -> None:
        """The state changed: save it within `interval` (at the next `poll` after that)."""
        self.changed = True

    def after_round(self, changed: bool) -> None:
        """A decision round ran: the state changed if it `changed` something or measurements
        arrived since the last save."""
        if changed or self.costs.counts["measured"] != self._measured:
            self.request()

    def saved(self, now: float, measured: int, grouped: object) -> None:
        """A save of the current state (`measured`: the book's count then, `grouped`: its
        groups) completed on the caller's side at `now`."""
        self.changed, self._began, self._measured = False, now, measured
        self._grouped, self.unsaved_since = grouped, None

    def save_now(self) -> None:
        """Save on the caller's thread, after any write in flight; a failure raises, and the
        state stays changed for `poll` to save again (`unsaved_since` set)."""
        self.wait()
        measured, grouped = self.costs.counts["measured"], self._groups_now()
        try:
            save(self.directory, self.devices, self.costs, self.groups)
        except BaseException:
            self._unsaved()
            raise
        self.saved(self.clock.now(), measured, grouped)

    def _unsaved(self) -> None:
        self.changed = True
        if self.unsaved_since is None:
            self.unsaved_since = self.clock.now()

    def _groups_now(self) -> object:
        """What of the groups a save keeps, to compare: their rounds and members."""
        if self.groups is None:
            return None
        return self.groups.rounds, [(key, m.size, sorted(m.ranks.items()))
                                    for key, m in self.groups.groups.profiles.items()]

    def poll(self, now: float) -> None:
        """Report a finished write; start the next one when one is due."""
        self._collect()
        grouped = self._groups_now()
        if grouped != self._grouped:  # a group round ran, or a group's members changed
            self.request()
        if not self.changed or self._pending is not None or now < self._began + self.interval:
            return
        began, measured = self.clock.now(), self.costs.counts["measured"]
        tree = stateformat.snapshot(dict(self.devices), self.costs, self.groups)
        self.changed, self._began, self._measured = False, now, measured
        self._grouped = grouped
        self._pending = _Write(self.directory, tree, self.clock)
        threads.start(self._pending)
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
            write(self.directory, self.tree)
        except BaseException as e:  # whatever it is, the loop reports it and saves again
            self.error = e if isinstance(e, Exception) else RuntimeError(repr(e))
        self.seconds = self.clock.now() - began
        self.tree = {}  # its statistics' memory goes now, not at the next save


def remove_state(directory: Path, remove_directory: bool = False) -> list[Path]:
    """Remove the state kept in `directory` (`gearshift cleanup --state`); the paths removed,
    [] when there is none. Only gearshift's own names go (the state file, the `.corrupt` copy,
    temp files of a save, then the lock file), unlinked relative to the directory (never
    following a symlink) while holding its `StateLock` (so never while a controller holds it:
    NamespaceBusy naming its pid). The directory is opened and checked as a controller's is
    (`statedir.opened`); a refusal is a StateError saying nothing was removed. The directory
    itself goes too when asked (`gearshift`'s own default directory) and that leaves it
    empty."""
    if not os.path.lexists(directory):
        return []
    removed = []
    try:
        with statedir.opened(directory, create=False) as fd:
            lock = StateLock.acquire(directory)  # NamespaceBusy while a controller holds it
            try:
                temps = sorted(n for n in os.listdir(fd) if n.startswith(TEMP_PREFIX))
                for name in [STATE_FILE, CORRUPT_FILE, *temps, LOCK_FILE]:
                    try:
                        os.unlink(name, dir_fd=fd)
                    except FileNotFoundError:
                        continue
                    removed.append(directory / name)
            finally:
                lock.release()
    except UnsafeStateDir as e:
        raise StateError(f"{e}: nothing removed") from None
    except NotADirectoryError:
        raise StateError(f"state directory {directory} is not one: nothing removed") from None
    if remove_directory:
        try:
            os.rmdir(directory)
        except OSError:  # not empty (other files, or a controller started meanwhile): kept
            pass
        else:
            removed.append(directory)
    return removed
