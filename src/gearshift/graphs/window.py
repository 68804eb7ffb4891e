"""The capture window of a process (`GUARD`): a recording is exclusive, and what must not overlap
one (device synchronizes, `empty_cache()`, resets, replays, and the user's device-wide syncs and
default-generator sampling, `outside_capture()`) takes it shared and waits for it
(`graphs.device` says why each; docs/architecture.md, "Hazards on the device")."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any


class CaptureGuard:
    """The capture window of a process: `exclusive()` for a recording, `shared()` for what must
    not overlap one. Shared sections run together and nest on a thread; a recording waits for
    them to end, and new ones wait while a recording is underway or waiting (so neither side
    starves: a shared section waits for one recording at most)."""

    def __init__(self) -> None:
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._shared = self._waiting = 0
        self._capturing = False
        self._local = threading.local()
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

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        if getattr(self._local, "depth", 0):
            raise RuntimeError("a capture inside outside_capture() would wait for itself")
        with self._cond:
            self._waiting += 1
            self._cond.wait_for(lambda: not (self._capturing or self._shared))
            self._waiting -= 1
            self._capturing = True
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
        local = g._local
        depth = getattr(local, "depth", 0)
        local.depth = depth + 1
        if not depth:
            mutex = g._mutex
            mutex.acquire()
            try:
                if g._capturing or g._waiting:
                    g.blocked += 1
                    g._cond.wait_for(lambda: not (g._capturing or g._waiting))
                    g.blocked -= 1
                g._shared += 1
            finally:
                mutex.release()
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
        local = g._local
        local.depth = depth = local.depth - 1
        if depth:
            return
        mutex = g._mutex
        mutex.acquire()
        try:
            g._shared -= 1
            if not g._shared and g._waiting:
                g._cond.notify_all()
        finally:
            mutex.release()


GUARD = CaptureGuard()


def outside_capture() -> contextlib.AbstractContextManager[None]:
    """Hold off gearshift's captures in this process while the block runs (waiting for one
    underway to end): wrap in it any device-wide synchronize and any sampling on the default
    cuda/npu generator that may run while gearshift captures (`gs.outside_capture()`)."""
    return GUARD.shared()
