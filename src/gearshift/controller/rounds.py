"""A decision round as the controller keeps it once applied: counted and timed, logged, and
its changes as lists (`[dim, gear, action, reason]` per profile), the form the snapshot and the
status document carry."""

from __future__ import annotations

import logging
from collections import deque
from typing import Any

from gearshift.core.round import Round

log = logging.getLogger(__name__)


def count(rounds: dict[str, Any], recent: deque[float], seconds: float) -> None:
    """Add a round of `seconds` to `rounds` (count, seconds_sum, last_seconds) and `recent`."""
    recent.append(seconds)
    rounds["count"] += 1
    rounds["seconds_sum"] += seconds
    rounds["last_seconds"] = seconds


def change_lists(round: Round) -> dict[str, list[list[Any]]]:
    """The round's changes per profile as the snapshot and the status document carry them."""
    return {name: [[c.dim, c.gear, c.action, c.reason] for c in cs]
            for name, cs in round.changes.items()}


def log_round(device: int, round: Round, usage: float | None, seconds: float) -> None:
    """Each change at INFO, the round's trigger, memory reading and time at DEBUG."""
    for name, changes in round.changes.items():
        for c in changes:
            log.info(
                "device %d %s/%s: %s %d: %s", device, name, c.dim, c.action, c.gear, c.reason
            )
    log.debug("device %d: round (%s, memory %s) in %.1f ms", device, round.trigger, usage,
              seconds * 1e3)
