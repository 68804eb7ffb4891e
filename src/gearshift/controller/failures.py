"""The loop's failures: a phase that raises is counted and logged, and the loop goes on.

`guard(what, fn, *args)` runs one phase; its exception is `failed(what, error)`: counted in
`count` and logged with its traceback, at most every ERROR_LOG_SECONDS per `what`, so a phase
failing flat out cannot flood the log.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from gearshift.clock import Clock

log = logging.getLogger("gearshift.controller.controller")  # the loop's failures, as before

ERROR_LOG_SECONDS = 10.0  # an error repeating in a phase is logged at most this often


class Failures:
    """The failures of one controller's phases, counted and logged (throttled per phase)."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.count = 0  # phases that failed
        self._logged: dict[str, float] = {}  # what -> when it was last logged

    def guard(self, what: str, fn: Callable[..., object], *args: Any) -> None:
        """Run `fn(*args)`; an Exception is `failed(what, it)`, not raised."""
        try:
            fn(*args)
        except Exception as e:
            self.failed(what, e)

    def failed(self, what: str, error: Exception) -> None:
        """Count a failure and log it with its traceback, at most every ERROR_LOG_SECONDS."""
        self.count += 1
        now = self.clock.now()
        if now - self._logged.get(what, -math.inf) >= ERROR_LOG_SECONDS:
            self._logged[what] = now
            log.error("%s failed; the loop goes on", what, exc_info=error)
