"""The lock of a namespace: the POSIX semaphore `/gearshift.<ns>.lock` (the file
`/dev/shm/sem.gearshift.<ns>.lock`), held for microseconds around every multi-word change of
the slot table (control.py).

Its holder bumps the control segment's `lock_count` word and records its realm (liveness.realm)
in `lock_realm`, then its identity in `lock_owner`; a waiter gives up after its wait (`timeout`
unless it asks for less; a wait cut short by a handled signal goes on to its end) with
NamespaceBusy naming the holder. `repair` releases a lock whose holder died holding it: its
recorded identity is dead in the repairer's own realm, or none is recorded, or the holder is of
another realm (its pid means nothing here), and `lock_count` stays the same while the lock stays
held for a whole `timeout` (a holder killed between acquiring and recording itself, or between
clearing and releasing, or anywhere if it is of another realm; a live one holds it for
microseconds), observed across calls no more than STALE seconds apart, so a
caller that must not wait (the controller's loop) calls it once per iteration with
`wait=False`. A live holder's lock is never released, nor one held unrecorded for less than a
whole `timeout`. Repairs are serialised by an exclusive flock on the control segment's file,
taken without waiting; under it the repairer checks that the holder, the count and the held
semaphore are still the ones it judged, bumps the count and releases: of two repairers at once
one repairs and the other finds the count changed, so the semaphore never counts above 1.

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
STALE = 0.25  # seconds: observations of an unrecorded holder further apart start over
Words = memoryview  # a segment's 8-byte words


def semaphore_name(namespace: str) -> str:
    """The name under /dev/shm of the namespace's semaphore (`sem.` + its name)."""
    return "/sem." + names.lock(namespace).lstrip("/")


class NamespaceLock:
    """The opened semaphore of `namespace`; `words[owner]` is the `lock_owner` word,
    `words[owner + 1]` the `lock_count` word and `words[realm]` the `lock_realm` word."""

    def __init__(
        self, namespace: str, sem: posix_ipc.Semaphore, inode: Inode, words: Words, owner: int,
        realm: int,
    ) -> None:
        self.namespace, self.inode, self.timeout = namespace, inode, TIMEOUT
        self._sem, self._words, self._at, self._realm_at = sem, words, owner, realm
        self._suspect: tuple[int, float, float] | None = None  # (count, first seen, last seen)

    def _owner(self) -> int:
        return self._words[self._at]

    def _record(self, ident: int) -> None:
        if ident:
            self._words[self._realm_at] = liveness.realm()  # before the identity it qualifies
        self._words[self._at] = ident

    def _ours(self) -> bool:
        """Whether the recorded holder's realm is this process's (its identity reads here)."""
        return self._words[self._realm_at] == liveness.realm()

    def _count(self) -> int:
        return self._words[self._at + 1]

    def _bump(self) -> None:
        self._words[self._at + 1] = (self._words[self._at + 1] + 1) & ((1 << 64) - 1)

    @classmethod
    def create(cls, namespace: str, words: Words, owner: int, realm: int) -> NamespaceLock:
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
        return cls._checked(namespace, sem, words, owner, realm)

    @classmethod
    def open(cls, namespace: str, words: Words, owner: int, realm: int) -> NamespaceLock:
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
        return cls._checked(namespace, sem, words, owner, realm)

    @classmethod
    def _checked(
        cls, namespace: str, sem: posix_ipc.Semaphore, words: Words, owner: int, realm: int
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
        return cls(namespace, sem, inode, words, owner, realm)

    @property
    def value(self) -> int:
        return self._sem.value

    @contextmanager
    def held(self, wait: float | None = None) -> Iterator[None]:
        """Hold the lock, recording this process as its holder; NamespaceBusy after `wait`
        seconds (default: `timeout`)."""
        me = liveness.current()  # before acquiring: a holder killed unrecorded costs a repair wait
        wait = self.timeout if wait is None else min(wait, self.timeout)
        clock = MonotonicClock()
        deadline = clock.now() + wait
        try:
            while True:
                try:
                    self._sem.acquire(max(0.0, deadline - clock.now()))
                    break
                except posix_ipc.SignalError:  # a handled signal (SIGTERM) cut the wait short
                    continue
        except posix_ipc.BusyError:
            owner = self._owner()
            if not self._ours():
                state = "of another pid namespace: freed if it stays held for the lock timeout"
            elif liveness.alive(owner):
                state = "alive"
            else:
                state = "dead: the controller or cleanup frees it"
            raise NamespaceBusy(
                f"the lock of namespace {self.namespace!r} is held over {wait:g} s by "
                f"pid {liveness.pid_of(owner)} ({state})"
            ) from None
        self._bump()
        self._record(me)
        try:
            yield
        finally:
            self._record(0)
            self._sem.release()

    def repair(
        self, control: segment.Segment, clock: Clock | None = None, wait: bool = True
    ) -> bool:
        """Release the lock if its holder died holding it (see the module docstring); False if
        it is free, held by a live process, held unrecorded for less than `timeout` so far
        (`wait`: wait until that is decided), or another repairer is at it. `control` is the
        namespace's control segment, whose file serialises the repairers."""
        clock = clock or MonotonicClock()
        while True:
            judged = self._judge(clock.now())
            if judged is False or (judged is None and not wait):
                return False
            if judged is not None:
                return self._release_stuck(control, *judged)
            clock.sleep(0.001)

    def _judge(self, now: float) -> tuple[int, int] | bool | None:
        """(owner, count) of a lock held by a dead holder; False if it is free or its holder
        lives; None while an unrecorded holder, or one of another realm, is observed for less
        than `timeout` (followed across calls in `_suspect`)."""
        if self._sem.value != 0:
            self._suspect = None
            return False
        owner, count = self._owner(), self._count()
        if owner and self._ours():
            self._suspect = None
            return False if liveness.alive(owner) else (owner, count)
        suspect = self._suspect
        if suspect is None or suspect[0] != count or now - suspect[2] > STALE:
            suspect = (count, now, now)
        self._suspect = (count, suspect[1], now)
        return (owner, count) if now - suspect[1] >= self.timeout else None

    def _release_stuck(self, control: segment.Segment, owner: int, count: int) -> bool:
        """Release the lock judged stuck with (owner, count), under the repairers' flock."""
        self._suspect = None
        try:
            fd = os.open(segment.path(control.name), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return False  # gone (or replaced by a link): not ours to repair
        try:
            info = os.fstat(fd)
            if (info.st_dev, info.st_ino) != control.inode:
                return False  # the name stands for another namespace now
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # another repairer is at it
            if self._sem.value != 0 or self._owner() != owner or self._count() != count:
                return False  # released, repaired or taken meanwhile: not that holder's any more
            self._bump()
            self._record(0)
            self._sem.release()
            return True
        finally:
            os.close(fd)  # releases the flock

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
