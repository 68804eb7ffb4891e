"""The figures of a stress run, their accounting (docs/tools.md) and its invariants."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

KEYS = (
    "workers",
    "seconds",
    "events_sent",
    "events_consumed",
    "events_dropped",
    "events_lost",
    "snapshots_published",
    "torn_snapshots_accepted",
    "worker_kills",
    "controller_kills",
    "route_stall_ms_max",
    "propagation_ms_p99",
    "leaked_segments",
)
STALL_MS = 1.0  # the bound on route_stall_ms_max
INVARIANTS = (  # what the verdict checks, as it states them
    "torn_snapshots_accepted = 0",
    "events_lost = 0",
    "leaked_segments = 0",
    f"route_stall_ms_max <= {STALL_MS}",
    "versions_routed_unpublished = 0",
    "namespace_replaced = 0",
    "controllers_at_once = 0",
)
COUNTING = (
    "events_dropped: refused by a full ring and counted by its worker (allowed: route() never "
    "waits); events_lost = sent - consumed - dropped - discarded (events_discarded: a dead "
    "worker's ring a new worker reused without a controller): events that vanished (must be 0)"
)


@dataclass
class StressReport:
    """The figures of one run (`summary()`: exactly KEYS), and diagnostics in `details`."""

    workers: int
    seconds: float
    events_sent: int
    events_consumed: int
    events_dropped: int
    events_lost: int
    snapshots_published: int
    torn_snapshots_accepted: int
    worker_kills: int
    controller_kills: int
    route_stall_ms_max: float
    propagation_ms_p99: float | None
    leaked_segments: int
    details: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in KEYS}

    def violations(self) -> list[str]:
        """The invariants the run broke, as `figure = value`: torn, lost or leaked != 0, a
        stall over STALL_MS, a worker routing on a version that was never published."""
        figures = {**self.summary(), **self.details}
        broken = {
            "torn_snapshots_accepted": self.torn_snapshots_accepted != 0,
            "events_lost": self.events_lost != 0,
            "leaked_segments": self.leaked_segments != 0,
            "route_stall_ms_max": self.route_stall_ms_max > STALL_MS,
            "versions_routed_unpublished": figures.get("versions_routed_unpublished", 0) != 0,
            "namespace_replaced": figures.get("namespace_replaced", 0) != 0,
            "controllers_at_once": figures.get("controllers_at_once", 0) != 0,
        }
        return [f"{name} = {figures[name]}" for name, bad in broken.items() if bad]

    def verdict(self) -> str:
        """One line: PASS, or FAIL with what broke; either way the invariants checked."""
        broken = self.violations()
        head = f"FAIL: {', '.join(broken)}" if broken else "PASS"
        return f"{head} (checked: {', '.join(INVARIANTS)})"


def sent(started: int, finished: int, recorded: int) -> int:
    """Events one worker incarnation sent, from its counters and its ring's head + dropped
    (`recorded`): a call in flight when it was killed (started = finished + 1) counts iff its
    event reached the ring. Any other mismatch leaves `finished`, and shows as lost != 0."""
    return started if recorded == started else finished


def tail_percentile(slow: Sequence[int], calls: int, q: float, floor: int) -> int:
    """The q-quantile (nearest rank) of `calls` values knowing only those over `floor`
    (`slow`); `floor` when it is not one of them."""
    rank = calls - math.ceil(round(q * calls, 9)) + 1  # from the top
    return sorted(slow, reverse=True)[rank - 1] if 0 < rank <= len(slow) else floor


def ms(ns: float) -> float:
    return round(float(ns) / 1e6, 3)
