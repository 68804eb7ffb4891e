"""Removing a namespace's state on request (`gearshift cleanup --state`).

Only gearshift's own names in the state directory go: the state file, the `.corrupt` copy set
aside by `--fresh-on-corrupt-state`, temp files of a save, then the lock file, all while holding
the directory's `StateLock` (so never while a controller holds it: NamespaceBusy naming its
pid). The directory must be this user's, writable by no other, and no symlink; its entries are
unlinked relative to it, and unlinking never follows a symlink. The directory itself goes too
when asked (`gearshift`'s own default directory) and that leaves it empty.
"""

from __future__ import annotations

import os
from pathlib import Path

from gearshift.controller import statedir
from gearshift.controller.statefile import LOCK_FILE, STATE_FILE, TEMP_PREFIX, StateLock
from gearshift.errors import StateError, UnsafeStateDir

CORRUPT_FILE = STATE_FILE + ".corrupt"


def remove_state(directory: Path, remove_directory: bool = False) -> list[Path]:
    """Remove the state kept in `directory` (see the module docstring); the paths removed, []
    when there is none. The directory is opened and checked as a controller's is
    (`statedir.opened`); a refusal is a StateError saying nothing was removed."""
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
