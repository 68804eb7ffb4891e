"""Objects reset in a child forked from this process (pre-fork servers, gunicorn-style).

A `Tracked` set holds its objects weakly; its `reset`, registered by its owner as an
`os.register_at_fork(after_in_child=...)` hook, runs each live object's `_forked` in the
child. Each runs on its own: one that raises is logged and the others still run, so a fork
never fails, nor leaves the rest unreset, because of one object.
"""

from __future__ import annotations

import logging
import os
import weakref
from typing import Protocol

log = logging.getLogger(__name__)


class Forkable(Protocol):
    def _forked(self) -> None: ...


class Tracked:
    """The live objects of one kind (`what`, for the log) to reset in a forked child."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._items: weakref.WeakSet[Forkable] = weakref.WeakSet()

    def track(self, item: Forkable) -> None:
        """Reset `item` in every child forked from this process from now on."""
        self._items.add(item)

    def reset(self) -> None:
        """In the child: every tracked object's `_forked`, each isolated."""
        for item in list(self._items):
            try:
                item._forked()
            except Exception:  # never fail a fork
                log.exception("resetting %s in forked child pid %d", self.what, os.getpid())
