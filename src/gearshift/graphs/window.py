"""The capture window of a process (`GUARD`): a recording is exclusive, and what must not overlap
one (device synchronizes, `empty_cache()`, resets, replays, and the user's device-wide syncs and
default-generator sampling, `outside_capture()`) takes it shared and waits for it
(`graphs.device` says why each; docs/architecture.md, "Hazards on the device")."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from threading import get_ident
from typing import Any


class CaptureGuard:
    """The capture window of a process: `exclusive()` for a recording, `shared()` for what must
    not overlap one. Shared sections run together and nest on a thread; a recording waits for
    them to end, and new ones wait while a recording is underway or waiting (so neither side
    starves: a shared section waits for one recording at most).

    A shared section is its thread's id in `_holders` (a list: `append` and `remove` are
    single operations under the GIL), added before the section reads the flags `_capturing`
    and `_waiting` and taken away when it ends, so its common case takes no lock. A recording
    raises `_waiting` under the mutex before it reads `_holders`, and `_capturing` before it
    lowers `_waiting`: a section that finds both flags down was seen by any recording that
    starts after it; one that finds either up takes its id back and waits under the mutex,
    unless its thread holds another section (nested: it runs)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._holders: list[int] = []  # per shared section underway, its thread's id
        self._waiting = 0
        self._capturing = False
        self.blocked = 0  # shared sections waiting now (for tests and stats)
        self._section = _Shared(self)

    def shared(self) -> contextlib.AbstractContextManager[None]:
        return self._section

    def holding(self, lock: threading.Lock,
                order: Any = None) -> contextlib.AbstractContextManager[None]:
        """A shared section that then takes `lock` and, with an `order` (`workspaces.Order`),
        runs inside `order.inside()`: a runner's replay section, entered and left as one
        context manager (the request path's: one enter and one exit, not three). Nests in
        other shared sections of the thread; not in itself (`lock` does not)."""
        return _Shared(self, lock, order)

    def _wait(self, ident: int) -> None:
        """A shared section of thread `ident` (in `_holders`) that found a recording underway
        or waiting: it runs if its thread holds another (nested), else it takes its id back
        and waits for the recording, then adds it again."""
        with self._cond:
            holders = self._holders
            if holders.count(ident) > 1:
                return
            holders.remove(ident)
            if not holders:  # a recording may be waiting for this very section to go
                self._cond.notify_all()
            self.blocked += 1
            self._cond.wait_for(lambda: not (self._capturing or self._waiting))
            self.blocked -= 1
            holders.append(ident)

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        if threading.get_ident() in self._holders:
            raise RuntimeError("a capture inside outside_capture() would wait for itself")
        with self._cond:
            self._waiting += 1
            self._cond.wait_for(lambda: not (self._capturing or self._holders))
            self._capturing = True  # before `_waiting` is lowered: never both down meanwhile
            self._waiting -= 1
        try:
            yield
        finally:
            with self._cond:
                self._capturing = False
                self._cond.notify_all()


class _Shared:
    """`CaptureGuard.shared()` (and `holding`, with a lock and an order taken after it): a
    plain context manager (the request path takes it per run), nesting per thread; its first
    level takes the condition's lock directly (the request path's cost) and waits on the
    condition only while a recording is underway or waiting."""

    __slots__ = ("guard", "inner", "lock", "order")

    def __init__(self, guard: CaptureGuard, lock: threading.Lock | None = None,
                 order: Any = None) -> None:
        self.guard, self.lock, self.order = guard, lock, order
        self.inner: Any = None  # the order's block underway (written under `lock`)

    def __enter__(self) -> None:
        g = self.guard
        ident = get_ident()
        g._holders.append(ident)
        if g._capturing or g._waiting:
            g._wait(ident)
        lock = self.lock
        if lock is None:
            return
        lock.acquire()
        if self.order is not None:
            try:
                inner = self.order.inside()
                inner.__enter__()
            except BaseException:
                self.__exit__(None, None, None)  # no inner: the lock, then the window
                raise
            self.inner = inner

    def __exit__(self, *exc: object) -> None:
        lock = self.lock
        if lock is not None:
            inner, self.inner = self.inner, None
            try:
                if inner is not None:
                    inner.__exit__(*exc)
            finally:
                lock.release()
        g = self.guard
        holders = g._holders
        holders.remove(get_ident())
        if g._waiting and not holders:
            with g._cond:
                g._cond.notify_all()


GUARD = CaptureGuard()


def outside_capture() -> contextlib.AbstractContextManager[None]:
    """Hold off gearshift's captures in this process while the block runs (waiting for one
    underway to end): wrap in it any device-wide synchronize and any sampling on the default
    cuda/npu generator that may run while gearshift captures (`gs.outside_capture()`)."""
    return GUARD.shared()
