"""Leases: liveness that every participant of a namespace can judge, whatever its pid namespace.

The controller and every worker slot keep, beside their identity (liveness.py), the `realm`
they were read in and a `beats` counter that the participant bumps at least every BEAT seconds:
`renewer`, one daemon thread per process, renews every lease the process holds every BEAT / 2
(a `Registry` adds its controller word and its slots as it claims them, removes them as it
releases them or closes), so a long compile, a state restore or a slow loop iteration never
lets a live participant's lease lapse; the loop and the heartbeats bump it too. A judge:

- of the same realm checks the identity: exact and at once (pid and start time);
- of another realm cannot read that pid. It `Watch`es the lease: the participant is judged dead
  once its (identity, beats) stayed the same for LEASE seconds of the judge's own clock, from
  the judge's first look. A first look never judges anyone dead, so a one-shot judge (a worker
  leaving, a status reading) takes every participant of another realm for alive, and only a
  judge that keeps looking (the controller's scans, a worker's swap thread, a starting
  controller's wait) reclaims a dead one: within LEASE of its first look after the death.

No clock is shared: the counter is compared with itself, timed by the judge's own clock, so
time namespaces (CRIU restores, sandboxes) and a clock's offset change nothing. A live
participant that beats at least every LEASE seconds is never judged dead; one stopped longer
(SIGSTOP, a debugger) may be, and finds its slot or its controller word taken when it resumes
(the worker re-attaches, the controller stops: two live controllers are never both in charge).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Hashable

from gearshift import threads

log = logging.getLogger(__name__)
BEAT = 1.0  # seconds: the longest a participant waits between two beats
LEASE = 5.0  # seconds without a beat after which a participant of another realm is dead


class Watch:
    """One judge's observations: per key (a slot, the controller), the (identity, beats) last
    seen and when it was first seen so. Bounded: one entry per key."""

    def __init__(self, lease: float = LEASE) -> None:
        self.lease = lease
        self._seen: dict[Hashable, tuple[tuple[int, ...], float]] = {}

    def expired(self, key: Hashable, value: tuple[int, ...], now: float) -> bool:
        """Whether `value` (identity, beats, ...) of `key` stayed the same for `lease` seconds
        since this watch first saw it so; a new value starts the count again."""
        seen = self._seen.get(key)
        if seen is None or seen[0] != value:
            self._seen[key] = (value, now)
            return False
        return now - seen[1] >= self.lease

    def changed(self, key: Hashable, value: tuple[int, ...]) -> bool:
        """Whether `value` differs from what this watch saw of `key` last (a beat: alive)."""
        seen = self._seen.get(key)
        return seen is not None and seen[0] != value

    def since(self, key: Hashable) -> float | None:
        """When this watch first saw the current value of `key` (None: never looked)."""
        seen = self._seen.get(key)
        return None if seen is None else seen[1]


class Renewer:
    """The process's lease thread: calls every renewal added (`add`) every BEAT / 2 until it
    is removed. A renewal that raises is logged and dropped. In a forked child it renews
    nothing of its parent's (the leases are the parent's)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._renewals: dict[Hashable, Callable[[], None]] = {}
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    def add(self, key: Hashable, renew: Callable[[], None]) -> None:
        with self._lock:
            self._renewals[key] = renew
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="gearshift-lease",
                                                daemon=True)
                threads.start(self._thread)

    def remove(self, key: Hashable) -> None:
        with self._lock:
            self._renewals.pop(key, None)

    def _run(self) -> None:
        while True:
            with self._lock:
                renewals = list(self._renewals.items())
            for key, renew in renewals:
                try:
                    renew()
                except Exception as e:  # an unmapped registry: its owner closed it meanwhile
                    log.debug("lease %r not renewed: %r", key, e)
                    self.remove(key)
            self._wake.wait(BEAT / 2)

    def _forked(self) -> None:
        self._lock = threading.Lock()
        self._renewals, self._thread = {}, None


renewer = Renewer()
os.register_at_fork(after_in_child=renewer._forked)
