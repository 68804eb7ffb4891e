"""What stands for a client's shared memory until it exists: `NO_SNAPSHOT` for the device's
snapshot region (version 0, nothing to read) and `Unrecorded` for the slot's event ring.

A client that starts before its controller has no slot, so no ring: its profiles bind their
record writer to an `Unrecorded`, which counts and drops each record until the client creates
its ring and forwards it there (`forward`), so those profiles record from then on; the client
then rebinds them to the ring itself (`Router._rebind`). A client forked from its process's
gives its `Unrecorded` a `first_use`: the first record starts what gets the child a ring.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class NoSnapshot:
    """Stands for the device's snapshot region until the controller has created it."""

    @staticmethod
    def version() -> int:
        return 0

    @staticmethod
    def read() -> None:
        return None


NO_SNAPSHOT = NoSnapshot()


class Unrecorded:
    """Stands for the event ring until the client has one: a record is counted (`count`) and
    goes nowhere; after `forward(write)` (the ring's) it goes there, for a request that was
    already under way when its profile was rebound to the ring."""

    def __init__(self, first_use: Callable[[], None] | None = None) -> None:
        self.count = 0
        self._target: Callable[..., bool] | None = None
        self._lock = threading.Lock()
        self._first_use = first_use  # called once, by the first record counted

    def write(self, t_ns: int, v0: int, v1: int, v2: int, v3: int, meta: int, counts: int) -> bool:
        """The ring's `write` once forwarded; until then count the record and return False."""
        target = self._target
        if target is not None:
            return target(t_ns, v0, v1, v2, v3, meta, counts)
        with self._lock:
            self.count += 1
            first, self._first_use = self._first_use, None
        if first is not None:
            try:
                first()
            except Exception:  # the request path never raises because of it
                log.exception("an unrecorded client's first record: starting its swap thread")
        return False

    def forward(self, write: Callable[..., bool]) -> None:
        """Send every record to `write` from now on."""
        self._target = write
