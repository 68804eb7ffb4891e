"""The books of a stress run: what the harness records as it goes, and the report made of them.

The harness records every worker incarnation, the kills, the controller's incarnations and
downtime, and the events it could not attribute; `Tally.count` adds what the processes left:
the counter files, the rings' final counters, the logs and the journal. sent, consumed, dropped
and lost are exact whatever instant a SIGKILL lands on (the accounting: docs/tools.md).
"""

from __future__ import annotations

import math
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gearshift.shm import EventRing
from gearshift.tools.stress import report, roles
from gearshift.tools.stress.journal import Journal
from gearshift.tools.stress.report import StressReport


@dataclass
class Incarnation:
    """One worker process; its ring is mapped once it reported ready."""

    index: int
    device: int
    proc: subprocess.Popen
    log: Path
    counters: Path
    ring: EventRing | None = None
    final: tuple[int, int, int] | None = None  # head, tail, dropped, once they cannot change


@dataclass
class Tally:
    """What a run in `directory` (its logs, counter files and journal) has recorded so far."""

    namespace: str
    directory: Path
    workers: int
    seconds: float
    incarnations: list[Incarnation] = field(default_factory=list)
    kills: dict[str, int] = field(default_factory=lambda: {"worker": 0, "controller": 0})
    controllers: int = 0  # incarnations
    downtime: list[list[int]] = field(default_factory=list)  # [killed, back up] monotonic ns
    unattributed: dict[int, int] = field(default_factory=dict)  # controller pid -> unknown+invalid
    namespace_replaced: int = 0  # control segments replaced under live participants
    controllers_at_once: int = 0  # the controller word taken from a live controller
    discarded: int = 0  # events of reused slots' rings dropped undrained (the control segment's)

    def count(self, readers: int, leaked: int) -> StressReport:
        """The figures, once every process has ended and every ring's counters are final."""
        sent = consumed = dropped = calls = 0
        mismatched = []
        for w in self.incarnations:
            started, finished = struct.unpack_from("<QQ", w.counters.read_bytes())
            calls += finished
            if w.final is None:
                continue  # never ready: it routed nothing
            head, tail, drops = w.final
            sent += report.sent(started, finished, head + drops)
            consumed += tail
            dropped += drops
            if not finished <= head + drops <= started:
                mismatched.append(w.index)
        journal = Journal(self.directory).refresh()
        logs = [(w, roles.WorkerLog.read(w.log)) for w in self.incarnations]
        lags = [
            t_ns - max(t for t, _ in journal.entries[w.device, version])
            for w, log in logs
            for version, t_ns in log.versions[1:]
            if (w.device, version) in journal.entries
        ]
        stalls = [stall for _, log in logs for stall, _ in log.stalls]
        dead = [
            stall
            for _, log in logs
            for stall, t_ns in log.stalls
            if any(start <= t_ns <= (end or math.inf) for start, end in self.downtime)
        ]
        counts = [roles.reader_counts(self.directory / f"reader{i}.log") for i in range(readers)]
        return StressReport(
            workers=self.workers,
            seconds=self.seconds,
            events_sent=sent,
            events_consumed=consumed,
            events_dropped=dropped,
            events_lost=sent - consumed - dropped - self.discarded,
            snapshots_published=len(journal.entries),
            torn_snapshots_accepted=sum(r[3] for r in counts),
            worker_kills=self.kills["worker"],
            controller_kills=self.kills["controller"],
            route_stall_ms_max=report.ms(max(log.stall_max for _, log in logs)),
            propagation_ms_p99=report.ms(np.percentile(lags, 99)) if lags else None,
            leaked_segments=leaked,
            details={
                "namespace": self.namespace,
                "route_calls": calls,
                "route_stall_ms_p999": report.ms(
                    report.tail_percentile(stalls, calls, 0.999, roles.SLOW_NS)
                ),
                "route_stall_ms_max_controller_dead": report.ms(max(dead, default=0)),
                "route_wall_ms_max": report.ms(max(log.wall_max for _, log in logs)),
                "route_calls_interrupted": sum(log.interrupted for _, log in logs),
                "controller_dead_seconds": round(
                    sum(end - start for start, end in self.downtime if end) / 1e9, 2
                ),
                "worker_incarnations": len(self.incarnations),
                "controller_incarnations": self.controllers,
                "events_unattributed": sum(self.unattributed.values()),
                "snapshots_read": sum(r[0] for r in counts),
                "versions_verified": sum(r[1] for r in counts),
                "reads_refused": sum(r[2] for r in counts),
                "versions_routed_unpublished": sum(
                    (w.device, version) not in journal.entries
                    for w, log in logs
                    for version, _ in log.versions
                ),
                "counter_mismatches": mismatched,
                "events_discarded": self.discarded,
                "namespace_replaced": self.namespace_replaced,
                "controllers_at_once": self.controllers_at_once,
            },
        )
