"""A profile's measured graphs on their way to the controller, as MEASURED ring records.

The swap thread, never a request thread, moves them: `collect(runner)` takes the graph costs
the runner measured at capture (`take_measurements`, when it has it) and keeps one
`core.costs.Measurement` per dim of each graph (the dim's gear; the graph's seconds and
bytes), at most MAX_PENDING (the oldest go first, counted `dropped`); `flush` writes them to
the ring (`shm.ring.measured`), once the profile is registered, since the controller could
not map its id before. A cost out of Measurement's bounds is dropped, not raised; so is a
record a full ring refuses (the ring counts it too), and the rest wait for the next flush.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from gearshift.core.costs import Measurement
from gearshift.errors import ShapeError
from gearshift.shm import ring

log = logging.getLogger(__name__)
MAX_PENDING = 4096  # measurements held until the profile is registered and the ring has room


class Measured:
    """Measurements of one profile's graphs (dims in record order) not yet written;
    `written` and `dropped` count them, `failures` the reports that raised (the profile's)."""

    def __init__(self, dims: Sequence[str]) -> None:
        self.dims = tuple(dims)
        self.pending: deque[tuple[int, Measurement]] = deque()  # (dim index, measurement)
        self.written = self.dropped = self.failures = 0

    def collect(self, runner: Any) -> None:
        """Keep the costs `runner` measured since the last call."""
        take = getattr(runner, "take_measurements", None)
        if take is None:
            return
        for variant, cost in take():
            for i, dim in enumerate(self.dims):
                try:
                    m = Measurement(variant[dim], cost.capture_seconds, cost.graph_bytes,
                                    cost.replay_seconds)
                except (KeyError, ShapeError) as e:
                    self.dropped += 1
                    log.debug("measurement of %s dropped: %s", variant, e)
                    continue
                if len(self.pending) >= MAX_PENDING:
                    self.pending.popleft()
                    self.dropped += 1
                self.pending.append((i, m))

    def flush(self, write: Callable[..., bool], now_ns: int, profile: int, version: int) -> int:
        """Write the pending measurements as MEASURED records of `profile` (its local id) at
        snapshot `version`; stops at a full ring. Returns how many were written."""
        done = 0
        while self.pending:
            i, m = self.pending.popleft()
            record = ring.measured(profile, version, i, m.gear, m.capture_seconds, m.graph_bytes,
                                   m.replay_seconds)
            if not write(now_ns, *record):
                self.dropped += 1
                break
            done += 1
        self.written += done
        return done
