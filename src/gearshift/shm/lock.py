"""The lock of a namespace: the POSIX semaphore `/gearshift.<ns>.lock` (the file
`/dev/shm/sem.gearshift.<ns>.lock`), held for microseconds around every multi-word change of
the slot table (control.py).

Its holder records its identity in the control segment's `lock_owner` word; a waiter gives up
after `timeout` with NamespaceBusy naming it; `repair` releases a lock whose holder died holding
it (its recorded identity is dead, or none is recorded for a whole `timeout`). Repairs are
serialised by an exclusive flock on the control segment's file, taken without waiting: of two
repairers at once one repairs and the other leaves it, so the semaphore never counts above 1.

The semaphore is checked like a segment after every open (this user's, mode 0600: else
NotOwned), and `unlink` removes the name only while it names the semaphore this process
opened (same inode).
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager

import posix_ipc

from gearshift.clock import Clock, MonotonicClock
from gearshift.errors import NamespaceBusy
from gearshift.shm import liveness, names, segment
from gearshift.shm.segment import Inode

TIMEOUT = 5.0  # seconds; the critical sections are microseconds long
Words = memoryview  # a segment's 8-byte words


def semaphore_name(namespace: str) -> str:
    """The name under /dev/shm of the namespace's semaphore (`sem.` + its name)."""
    return "/sem." + names.lock(namespace).lstrip("/")


class NamespaceLock:
    """The opened semaphore of `namespace`; `words[owner]` is the `lock_owner` word."""

    def __init__(
        self, namespace: str, sem: posix_ipc.Semaphore, inode: Inode, words: Words, owner: int
    ) -> None:
        self.namespace, self.inode, self.timeout = namespace, inode, TIMEOUT
        self._sem, self._words, self._at = sem, words, owner

    def _owner(self) -> int:
        return self._words[self._at]

    def _record(self, ident: int) -> None:
        self._words[self._at] = ident

    @classmethod
    def create(cls, namespace: str, words: Words, owner: int) -> NamespaceLock:
        """Create the semaphore (free), replacing a stale one of this user (the creator of the
        control segment only); NotOwned if another user's is in the way."""
        name, file = names.lock(namespace), semaphore_name(namespace)
        stale = segment.stat_of(file)
        if stale is not None:
            segment.owned(file, stale)
            unlink(namespace, (stale.st_dev, stale.st_ino))
        try:
            sem = posix_ipc.Semaphore(name, posix_ipc.O_CREX, mode=0o600, initial_value=1)
        except (posix_ipc.ExistentialError, posix_ipc.PermissionsError):
            info = segment.stat_of(file)
            if info is not None:
                segment.owned(file, info)
            raise NamespaceBusy(
                f"{file} appeared while namespace {namespace!r} was created"
            ) from None
        return cls._checked(namespace, sem, words, owner)

    @classmethod
    def open(cls, namespace: str, words: Words, owner: int) -> NamespaceLock:
        """Open the existing semaphore; FileNotFoundError if there is none, NotOwned if it is
        not this user's alone."""
        name, file = names.lock(namespace), semaphore_name(namespace)
        try:
            sem = posix_ipc.Semaphore(name)
        except posix_ipc.ExistentialError:
            raise FileNotFoundError(errno.ENOENT, "no semaphore", file) from None
        except posix_ipc.PermissionsError:
            info = segment.stat_of(file)
            if info is not None:
                segment.owned(file, info)
            raise NamespaceBusy(f"{file} is not accessible to uid {os.geteuid()}") from None
        return cls._checked(namespace, sem, words, owner)

    @classmethod
    def _checked(
        cls, namespace: str, sem: posix_ipc.Semaphore, words: Words, owner: int
    ) -> NamespaceLock:
        file = semaphore_name(namespace)
        info = segment.stat_of(file)
        try:
            if info is None:
                raise FileNotFoundError(errno.ENOENT, "semaphore removed meanwhile", file)
            inode = segment.owned(file, info)
        except BaseException:
            sem.close()
            raise
        return cls(namespace, sem, inode, words, owner)

    @property
    def value(self) -> int:
        return self._sem.value

    @contextmanager
    def held(self) -> Iterator[None]:
        """Hold the lock, recording this process as its holder; NamespaceBusy after `timeout`."""
        me = liveness.current()  # before acquiring: a holder killed unrecorded costs a repair wait
        try:
            self._sem.acquire(self.timeout)
        except posix_ipc.BusyError:
            owner = self._owner()
            state = "alive" if liveness.alive(owner) else "dead: the controller or cleanup frees it"
            raise NamespaceBusy(
                f"the lock of namespace {self.namespace!r} is held over {self.timeout} s by "
                f"pid {liveness.pid_of(owner)} ({state})"
            ) from None
        self._record(me)
        try:
            yield
        finally:
            self._record(0)
            self._sem.release()

    def repair(self, control: segment.Segment, clock: Clock | None = None) -> bool:
        """Release the lock if its holder died holding it (see the module docstring); False if
        it is free, held by a live process, or another repairer is at it. `control` is the
        namespace's control segment, whose file serialises the repairers."""
        if self._sem.value != 0 or liveness.alive(self._owner()):
            return False
        try:
            fd = os.open(segment.path(control.name), os.O_RDONLY)
        except FileNotFoundError:
            return False
        try:
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) != control.inode:
                return False  # the name stands for another namespace now
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # another repairer is at it
            return self._repair(clock or MonotonicClock())
        finally:
            os.close(fd)  # releases the flock

    def _repair(self, clock: Clock) -> bool:
        owner = self._owner()
        if self._sem.value != 0 or (owner and liveness.alive(owner)):
            return False
        if not owner and not self._unrecorded_for(self.timeout, clock):
            return False
        if self._owner() != owner:  # released meanwhile: not that dead holder's any more
            return False
        self._record(0)
        self._sem.release()
        return True

    def _unrecorded_for(self, seconds: float, clock: Clock) -> bool:
        """The lock stays held with no holder recorded for `seconds`."""
        deadline = clock.now() + seconds
        while clock.now() < deadline:
            if self._sem.value != 0 or self._owner():
                return False
            clock.sleep(0.001)
        return True

    def close(self) -> None:
        self._sem.close()

    def unlink(self) -> bool:
        """Remove the semaphore's name if it still names this semaphore."""
        return unlink(self.namespace, self.inode)


def unlink(namespace: str, inode: Inode | None = None) -> bool:
    """Remove the namespace's semaphore if it is this user's (and, given `inode`, still that
    one); False if it is gone or another one. NotOwned if it is another user's."""
    file = semaphore_name(namespace)
    info = segment.stat_of(file)
    if info is None or (inode is not None and (info.st_dev, info.st_ino) != inode):
        return False
    segment.owned(file, info)
    try:
        posix_ipc.unlink_semaphore(names.lock(namespace))
    except posix_ipc.ExistentialError:
        return False
    return True
