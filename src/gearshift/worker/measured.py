"""A profile's measured graphs on their way to the controller, as MEASURED ring records.

The swap thread, never a request thread, moves them: `collect(runner)` takes the graph costs
the runner measured at capture (`take_measurements`, when it has it) and keeps one
`core.costs.Measurement` per dim of each graph (the dim's gear; the graph's seconds and
bytes), at most MAX_PENDING (the oldest go first, counted `dropped`); `flush` writes them to
the ring (`shm.ring.measured`), once the profile is registered, since the controller could
not map its id before. A cost out of Measurement's bounds is dropped, not raised; so is a
record a full ring refuses (the ring counts it too), and the rest wait for the next flush.

The runner's static input buffers (`buffer_bytes`, when it has it: per dim their gear, bytes
and bytes on the dim) go the same way as BUFFERS records (`shm.ring.buffers`), one per dim,
when they change and again every RESEND_NS (a controller restarted, or a record a full ring
dropped, has them back within that); a footprint out of `core.costs.buffer_line`'s bounds is
not sent.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from gearshift.core.costs import Measurement, buffer_line
from gearshift.errors import ShapeError
from gearshift.shm import ring

log = logging.getLogger(__name__)
MAX_PENDING = 4096  # measurements held until the profile is registered and the ring has room
RESEND_NS = 10 * 10**9  # the buffers' bytes are sent again this often, changed or not
Footprint = tuple[tuple[int, int, int], ...]  # per dim in record order: gear, bytes, on the dim


class Measured:
    """Measurements of one profile's graphs (dims in record order) not yet written;
    `written` and `dropped` count them, `failures` the reports that raised (the profile's)."""

    def __init__(self, dims: Sequence[str]) -> None:
        self.dims = tuple(dims)
        self.pending: deque[tuple[int, Measurement]] = deque()  # (dim index, measurement)
        self.written = self.dropped = self.failures = 0
        self.buffers: Footprint | None = None  # the runner's static buffers, as last collected
        self._sent: tuple[Footprint, int] | None = None  # the buffers last sent, and when (ns)

    def due(self, now_ns: int) -> bool:
        """Whether a flush at `now_ns` has records to write."""
        return bool(self.pending) or self._buffers_due(now_ns)

    def _buffers_due(self, now_ns: int) -> bool:
        return self.buffers is not None and (
            self._sent is None or self._sent[0] != self.buffers
            or now_ns - self._sent[1] >= RESEND_NS)

    def collect(self, runner: Any) -> None:
        """Keep the costs `runner` measured since the last call, and its buffers' bytes."""
        self._collect_buffers(runner)
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

    def _collect_buffers(self, runner: Any) -> None:
        footprint = getattr(runner, "buffer_bytes", None)
        if footprint is None:
            return
        sizes = footprint()
        try:
            buffers = tuple(tuple(map(int, sizes[d])) for d in self.dims)
            for cap, total, scaling in buffers:
                buffer_line(cap, total, scaling)
        except (KeyError, TypeError, ValueError, ShapeError) as e:
            self.buffers = None
            log.debug("buffers %s not sent: %s", sizes, e)
            return
        self.buffers = buffers

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
        if not self.pending and self._buffers_due(now_ns):
            assert self.buffers is not None
            for i, (cap, total, scaling) in enumerate(self.buffers):
                if not write(now_ns, *ring.buffers(profile, version, i, cap, total, scaling)):
                    self.dropped += 1
                    return done
            self._sent = (self.buffers, now_ns)
        return done
