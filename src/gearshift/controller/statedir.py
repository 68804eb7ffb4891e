"""The controller's state directory, opened and checked as the shared-memory objects are.

The directory is opened once per use (`opened`), with O_DIRECTORY|O_NOFOLLOW, and checked on
that descriptor: owned by our effective uid, no group or other write bit, not a symlink (give
its real path); else UnsafeStateDir naming it, its owner and its mode, and nothing in it is
opened. Every file in it is then opened relative to that descriptor (`dir_fd=`) with O_NOFOLLOW,
so a name swapped for a symlink between the check and the use is refused, never followed: the
lock file (created 0600, checked on its descriptor before it is written), the state file (read
only if it is a regular file of at most MAX_STATE_BYTES, opened O_NONBLOCK so a FIFO cannot
block the read; anything else is a StateError), and the temp file of a save (O_EXCL, renamed
over the state file within the directory, then the directory fsynced). A file of another user,
or one that others may write, is UnsafeStateDir too.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from gearshift.errors import StateError, UnsafeStateDir

MAX_STATE_BYTES = 256 << 20  # the largest state file read (and written)
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def _checked(path: Path, info: os.stat_result, what: str) -> None:
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != os.geteuid() or mode & 0o022:
        raise UnsafeStateDir(
            f"{what} {path} belongs to uid {info.st_uid} with mode {mode:04o}; gearshift uses "
            f"only a state directory and files of its own user (uid {os.geteuid()}) that no "
            f"other user may write: `chown {os.geteuid()}` and `chmod go-w` it, or choose "
            "another --state-dir (one gearshift creates is 0700)"
        )


@contextmanager
def opened(directory: Path, create: bool = True) -> Iterator[int]:
    """The checked descriptor of `directory` (created 0700 when `create` and absent), closed
    at the end; UnsafeStateDir if it is a symlink, another user's or writable by others."""
    if create:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR) and directory.is_symlink():
            raise UnsafeStateDir(f"state directory {directory} is a symlink: gearshift "
                                 "follows none; give its real path") from None
        raise
    try:
        _checked(directory, os.fstat(fd), "state directory")
        yield fd
    finally:
        os.close(fd)


def open_lock(directory: Path, dfd: int, name: str) -> int:
    """The lock file `name` of the directory `dfd` opened read-write (created 0600), checked
    before anything is written to it."""
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NONBLOCK | _NOFOLLOW, 0o600, dir_fd=dfd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UnsafeStateDir(f"{directory / name} is a symlink: gearshift follows none; "
                                 "remove it") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeStateDir(f"{directory / name} is not a regular file: remove it")
        _checked(directory / name, info, "lock file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read(directory: Path, dfd: int, name: str) -> bytes | None:
    """The bytes of the regular file `name` in `dfd` (None if absent); StateError if it is
    a symlink, not a regular file or over MAX_STATE_BYTES."""
    path = directory / name
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | _NOFOLLOW, dir_fd=dfd)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StateError(f"{path} is a symlink, not a state file") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise StateError(f"{path} is not a regular file (mode {info.st_mode:o})")
        _checked(path, info, "state file")
        if info.st_size > MAX_STATE_BYTES:
            raise StateError(f"{path} holds {info.st_size} bytes, over the {MAX_STATE_BYTES} "
                             "a state file may hold")
        chunks, left = [], MAX_STATE_BYTES + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise StateError(f"{path} grew over the {MAX_STATE_BYTES} bytes a state file "
                             "may hold while it was read")
        return b"".join(chunks)
    finally:
        os.close(fd)


def write_atomic(directory: Path, dfd: int, name: str, blob: bytes, prefix: str) -> None:
    """Replace `name` in `dfd` with `blob`: a new temp file `<prefix><random>` (O_EXCL),
    fsynced, renamed over it, the directory fsynced; StateError if `blob` is over
    MAX_STATE_BYTES (what is saved always reads back)."""
    if len(blob) > MAX_STATE_BYTES:
        raise StateError(f"{directory / name} not saved: {len(blob)} bytes, over the "
                         f"{MAX_STATE_BYTES} a state file may hold")
    tmp = prefix + secrets.token_hex(8)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=dfd)
    try:
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dfd)
        raise
    os.fsync(dfd)


def remove(dfd: int, prefix: str) -> None:
    """Remove the entries of `dfd` named `<prefix>...` (temp files a killed writer left)."""
    for entry in os.listdir(dfd):
        if entry.startswith(prefix):
            with suppress(FileNotFoundError):
                os.unlink(entry, dir_fd=dfd)


def set_aside(dfd: int, name: str, aside: str) -> None:
    """Rename `name` to `aside` within `dfd` (whatever it is: nothing is opened)."""
    os.replace(name, aside, src_dir_fd=dfd, dst_dir_fd=dfd)

