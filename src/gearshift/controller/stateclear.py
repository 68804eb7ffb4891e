"""Removing a namespace's state on request (`gearshift cleanup --state`).

Only gearshift's own names in the state directory go: the state file, the `.corrupt` copy set
aside by `--fresh-on-corrupt-state`, temp files of a save, then the lock file, all while holding
the directory's `StateLock` (so never while a controller holds it: NamespaceBusy naming its
pid). The directory must be this user's and no symlink; its entries are unlinked relative to it,
opened without following a symlink, and unlinking never follows one. The directory itself goes
too when asked (`gearshift`'s own default directory) and that leaves it empty.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gearshift.controller.statefile import LOCK_FILE, STATE_FILE, TEMP_PREFIX, StateLock
from gearshift.errors import StateError

CORRUPT_FILE = STATE_FILE + ".corrupt"


def remove_state(directory: Path, remove_directory: bool = False) -> list[Path]:
    """Remove the state kept in `directory` (see the module docstring); the paths removed, []
    when there is none."""
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        return []
    if not stat.S_ISDIR(info.st_mode):
        kind = "a symlink (gearshift follows none)" if stat.S_ISLNK(info.st_mode) else "not one"
        raise StateError(f"state directory {directory} is {kind}: nothing removed")
    if info.st_uid != os.geteuid():
        raise StateError(f"state directory {directory} belongs to uid {info.st_uid}, not to "
                         f"uid {os.geteuid()}: nothing removed")
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    removed = []
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (info.st_dev, info.st_ino):
            raise StateError(f"state directory {directory} was replaced meanwhile: nothing removed")
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
    finally:
        os.close(fd)
    if remove_directory:
        try:
            os.rmdir(directory)
        except OSError:  # not empty (other files, or a controller started meanwhile): kept
            pass
        else:
            removed.append(directory)
    return removed
