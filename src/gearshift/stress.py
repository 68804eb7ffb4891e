"""`gearshift stress`: many workers route flat out through the real client while the controller
decides on short intervals and snapshot readers verify every snapshot they accept; with chaos,
workers and the controller are SIGKILLed at random and restarted (DESIGN.md §6).

Processes, each `python -m gearshift.stress ROLE SPEC` in its own session (a Ctrl-C reaches
only the harness, which ends them):

- the controller: the real `Controller`, its intervals scaled down by SETTINGS (a decision
  round every 0.1 s: many snapshots), its state file in the run's directory;
- `workers` workers: `gs.connect` and `Profile.route` flat out, random shapes on 2 dims whose
  centres move every PHASE_SECONDS (so the policy keeps adding and evicting gears). Each runs
  the client's swap work (`Client.tick`: re-registration, adoption, heartbeats) itself between
  batches, every `Client.poll_interval`, and freezes its start-up heap (`gc.freeze()`), see
  "Stall";
- `devices` readers, each reading every device's snapshot region in a loop.

Chaos: about once a second a random worker is SIGKILLed and a new one started; about every
5 s the controller is SIGKILLed and restarted 0.2-0.8 s later on the same state file. All of
it lives in a fresh namespace and a temporary directory, both removed at the end, also after
an error, Ctrl-C or SIGTERM (a SIGKILLed harness leaves that to `gearshift cleanup`).

Accounting, exact whatever instant a SIGKILL lands on:

- sent: every worker incarnation has a counter file: `started` is stored before each route()
  call, `finished` after it, so a kill leaves at most one call in flight. A ring's `head`
  (events put) and `dropped` (events that found it full) are written only by the producer,
  each in the one store that commits the event; the call in flight recorded its event iff
  head + dropped == started. sent is `started` then, else `finished`: a route() that records
  no event, or two, shows up as lost != 0.
- consumed: the ring's `tail`, written only by the controller, in the one store that commits a
  drain. It is in shared memory, so it counts across controller restarts, and a controller
  killed mid-drain has not moved it (its successor takes the same records, once). The harness
  maps each incarnation's ring when the worker reports ready and keeps the mapping after the
  controller has drained and unlinked it, until the counters are final (worker dead, ring
  empty).
- dropped: the ring's `dropped`. lost = sent - consumed - dropped: events a worker recorded that
  no controller took out of its ring. What a SIGKILLed controller had taken but not yet saved
  (its statistics since its last state save) dies with it by design: not a lost event. Events
  a controller took but could not attribute (`unknown`/`invalid` in its status document, read
  every STATUS_SECONDS) are in `details`.

Torn snapshots: the controller journals every device publication (device, version, time,
payload) in a file of its own before the publishing store (`_JournaledRegion`). A reader takes
what `SnapshotRegion.read()` returns and counts it torn unless it is for that device, its
version never goes down, and its payload equals a journaled payload of that version (re-read
payloads of the version it already checked must equal that one). Workers must route only on
journaled versions too.

Stall: a route() call's wall time if its thread blocked during it (a voluntary context switch:
a lock, a sleep, I/O), else the call's CPU time. It counts route's own work (adopting a
snapshot, a collection its allocations trigger) and every wait, not the time the machine gave
the CPU to others: on an oversubscribed machine a thread is preempted for milliseconds
anywhere, and on a VM the vCPU itself stops (measured here: 15-50 ms gaps with no context
switch and no run time at all). The wall-clock maximum is in `details`; stalls over SLOW_NS
are logged at once, so the maximum holds for killed workers too. Measured with 4 workers on 2
cores, before the choices above: a client swap thread next to a pure-Python request loop
takes the GIL from it mid-call at every tick, and the call waits until that thread has been
scheduled, run and handed it back: 20-50 ms here, the price of the GIL on a busy machine (a
real worker releases the GIL while its graphs run, and its swap thread runs then); a full
collection of the start-up heap (numpy, click, gearshift) took 8 ms in whichever call it hit.

Propagation: from the journal time of a publication to the first route() planned on it, per
worker incarnation (the version it found at connect excluded).
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import mmap
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from resource import RUSAGE_THREAD, getrusage
from typing import Any

import click
import numpy as np

import gearshift as gs
from gearshift.client.session import Client
from gearshift.controller import status
from gearshift.controller.config import load_configs
from gearshift.controller.controller import Controller
from gearshift.errors import ControllerNotFound, GearshiftError, NamespaceBusy, PayloadError
from gearshift.shm import EventRing, Registry, SnapshotRegion, cleanup, codec, names
from gearshift.shm.ring import HEAD, TAIL
from gearshift.shm.segment import SHM_DIR

DIMS = {"B": gs.Dim(max=256), "S": gs.Dim(max=8192)}
PROFILE = "stress"
SETTINGS = (  # the policy's and the controller's intervals, scaled down: many publications
    "window_seconds=4",
    "half_life_seconds=2",
    "slice_seconds=0.25",
    "update_interval_seconds=0.2",
    "check_interval_seconds=0.1",
    "recent_use_protect_seconds=0.5",
    "scan_interval_seconds=0.1",
    "status_interval_seconds=0.1",
)
PHASE_SECONDS = 1.0  # the traffic's centres move this often
SPREAD = 0.15  # log-normal spread of the raw sizes around a centre
BATCH = 1024  # route() calls between looks at the clock and the stop flag
SLOW_NS = 50_000  # every call that stalls longer is logged at once
REPORT_SECONDS = 0.5  # workers and readers log their counts this often
STATUS_SECONDS = 0.2  # the harness reads the controller's status document this often
WAIT = 30.0  # seconds: the bound of every wait for a process
TICK = 0.01  # the harness's loop
COUNTERS = 64  # bytes of a counter file: started, finished (u64 each)
_JOURNAL = struct.Struct("<QQqQ")  # device, version, monotonic ns, payload length
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


@dataclass(frozen=True)
class StressConfig:
    workers: int = 4
    seconds: float = 30.0
    chaos: bool = False
    devices: int = 2  # workers are spread over them; one reader per device reads them all
    seed: int = 0
    namespace: str = ""  # "" -> a fresh one, unique to the run


@dataclass
class StressReport:
    """The figures of one run (`KEYS`, `summary()`), and diagnostics in `details`."""

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

    def violations(self, stall_ms: float = 1.0) -> list[str]:
        """The invariants this run broke: torn, lost or leaked != 0, a stall over `stall_ms`, a
        worker that routed on a version the controller never published."""
        figures = {**self.summary(), **self.details}
        checks = {
            "torn_snapshots_accepted": self.torn_snapshots_accepted == 0,
            "events_lost": self.events_lost == 0,
            "leaked_segments": self.leaked_segments == 0,
            "route_stall_ms_max": self.route_stall_ms_max <= stall_ms,
            "versions_routed_unpublished": not self.details.get("versions_routed_unpublished"),
        }
        return [f"{key} = {figures[key]}" for key, ok in checks.items() if not ok]


def run(config: StressConfig) -> StressReport:
    """Run the stress test; every process and segment it started is gone when it returns or
    raises (GearshiftError when a process fails on its own)."""
    harness = _Harness(config)
    try:
        harness.start()
        harness.drive()
        return harness.finish()
    finally:
        harness.teardown()


# -- the harness --


@dataclass
class _Incarnation:
    """One worker process; its ring is mapped (`ring`) once it reported ready."""

    index: int
    device: int
    proc: subprocess.Popen
    log: Path
    counters: Path
    slot: int | None = None
    ring: EventRing | None = None
    final: tuple[int, int, int] | None = None  # head, tail, dropped once they cannot change


class _Harness:
    def __init__(self, config: StressConfig) -> None:
        self.config = config
        self.namespace = names.validate(
            config.namespace or f"stress-{os.getpid()}-{os.urandom(4).hex()}"
        )
        self.dir = Path(tempfile.mkdtemp(prefix="gearshift-stress-"))
        self.rng = random.Random(config.seed)
        self.registry: Registry | None = None
        self.controller: subprocess.Popen | None = None
        self.controller_up = False
        self.restart_at: float | None = None
        self.controllers = 0
        self.current: list[_Incarnation] = []
        self.incarnations: list[_Incarnation] = []
        self.readers: list[subprocess.Popen] = []
        self.procs: list[subprocess.Popen] = []  # every process started
        self.kills = {"worker": 0, "controller": 0}
        self.downtime: list[tuple[int, int]] = []  # monotonic ns: controller killed, back up
        self.unattributed: dict[int, int] = {}  # controller pid -> unknown + invalid events
        self.next_status = 0.0

    def start(self) -> None:
        self._start_controller()
        self._wait(lambda: self.controller_up, "the controller to start")
        for i in range(self.config.devices):
            log = self.dir / f"reader{i}.log"
            log.touch()
            self.readers.append(
                self._spawn(
                    "reader",
                    f"reader{i}",
                    namespace=self.namespace,
                    devices=self.config.devices,
                    journal=str(self.dir),
                    log=str(log),
                )
            )
        self.current = [self._start_worker(i) for i in range(self.config.workers)]
        self._wait(lambda: all(w.ring is not None for w in self.current), "the workers to start")

    def drive(self) -> None:
        """Route for `seconds`, killing and restarting processes on the chaos plan."""
        began = time.monotonic()
        plan = _chaos_plan(self.config.seconds, self.rng) if self.config.chaos else []
        while (now := time.monotonic() - began) < self.config.seconds:
            self._poll()
            if plan and plan[0][0] <= now and self._kill(plan[0][1]):
                plan.pop(0)
            time.sleep(TICK)
        self._wait(lambda: self.controller_up, "the controller to restart")

    def finish(self) -> StressReport:
        """Stop gracefully: readers and workers (SIGTERM), then the controller, whose final
        drain and cleanup must leave nothing; then count."""
        for proc in [*self.readers, *(w.proc for w in self.current)]:
            proc.terminate()
        for proc in [*self.readers, *(w.proc for w in self.current)]:
            _reap(proc)
        assert self.controller is not None
        self.controller.terminate()
        if _reap(self.controller) != 0:
            raise GearshiftError(f"the controller failed at exit:\n{self._stderr('controller')}")
        for w in self.incarnations:
            self._finalize(w, force=True)
        leaked = _leaked(self.namespace)
        return _report(self, len(leaked))

    def teardown(self) -> None:
        """Kill whatever still runs, unmap, remove the namespace and the temporary directory."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for w in self.incarnations:
            if w.ring is not None:
                w.ring.close()
        if self.registry is not None:
            self.registry.close()
        with contextlib.suppress(GearshiftError):
            cleanup(self.namespace)
        shutil.rmtree(self.dir, ignore_errors=True)

    # processes

    def _spawn(self, role: str, name: str, **spec: Any) -> subprocess.Popen:
        with open(self.dir / f"{name}.err", "ab") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "gearshift.stress", role, json.dumps(spec)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,  # the terminal's Ctrl-C is the harness's to handle
            )
        self.procs.append(proc)
        return proc

    def _start_controller(self) -> None:
        self.controller = self._spawn(
            "controller",
            "controller",
            namespace=self.namespace,
            settings=SETTINGS,
            state_dir=str(self.dir / "state"),
            journal=str(self.dir / f"journal.{self.controllers}"),
        )
        self.controllers += 1
        self.controller_up = False
        self.restart_at = None

    def _start_worker(self, index: int) -> _Incarnation:
        number = len(self.incarnations)
        counters = self.dir / f"worker{index}.{number}.counters"
        counters.write_bytes(bytes(COUNTERS))
        log = self.dir / f"worker{index}.{number}.log"
        log.touch()
        device = index % self.config.devices
        proc = self._spawn(
            "worker",
            f"worker{index}",
            namespace=self.namespace,
            device=device,
            seed=[self.config.seed, index, number],
            log=str(log),
            counters=str(counters),
        )
        w = _Incarnation(index, device, proc, log, counters)
        self.incarnations.append(w)
        return w

    def _kill(self, what: str) -> bool:
        """SIGKILL the controller (restarted after a random pause) or a random ready worker
        (restarted at once); False when there is none to kill now."""
        if what == "controller":
            if not self.controller_up:
                return False
            assert self.controller is not None
            self.controller.kill()
            self.controller.wait()
            self.controller_up = False
            self.downtime.append((time.monotonic_ns(), 0))
            self.restart_at = time.monotonic() + self.rng.uniform(0.2, 0.8)
        else:
            ready = [w for w in self.current if w.ring is not None]
            if not ready:
                return False
            victim = self.rng.choice(ready)
            victim.proc.kill()
            victim.proc.wait()
            self.current[victim.index] = self._start_worker(victim.index)
        self.kills[what] += 1
        return True

    def _poll(self) -> None:
        """Follow the processes: controller restarts and ownership, workers' readiness, final
        ring counters, and processes that ended on their own (a failure)."""
        if self.restart_at is not None and time.monotonic() >= self.restart_at:
            self._start_controller()
        assert self.controller is not None
        if self.controller.poll() is not None and self.restart_at is None:
            raise GearshiftError(f"the controller exited:\n{self._stderr('controller')}")
        if not self.controller_up and self._owner() == self.controller.pid:
            self.controller_up = True
            if self.downtime and not self.downtime[-1][1]:
                self.downtime[-1] = (self.downtime[-1][0], time.monotonic_ns())
        for i, proc in enumerate(self.readers):
            if proc.poll() is not None:
                raise GearshiftError(f"reader {i} exited:\n{self._stderr(f'reader{i}')}")
        for w in self.current:
            if w.proc.poll() is not None:
                raise GearshiftError(
                    f"worker {w.index} exited:\n{self._stderr(f'worker{w.index}')}"
                )
            if w.ring is None:
                self._ready(w)
        for w in self.incarnations:
            self._finalize(w)
        if time.monotonic() >= self.next_status:
            self.next_status = time.monotonic() + STATUS_SECONDS
            doc = status.read(self.namespace)
            if doc is not None:
                events = doc["events"]
                self.unattributed[doc["pid"]] = events["unknown"] + events["invalid"]

    def _owner(self) -> int | None:
        if self.registry is None:
            try:
                self.registry = Registry.attach(self.namespace)
            except ControllerNotFound:
                return None
        info = self.registry.controller()
        return info.pid if info.alive else None

    def _ready(self, w: _Incarnation) -> None:
        for line in w.log.read_text().splitlines():
            if line.startswith("ready "):
                w.slot = int(line.split()[1])
                w.ring = EventRing.attach(self.namespace, w.slot)

    def _finalize(self, w: _Incarnation, force: bool = False) -> None:
        """Read a ring's counters once they are final (its worker dead, the ring drained; or
        `force`: at the end) and unmap it."""
        ring = w.ring
        if ring is None or w.final is not None or (w.proc.poll() is None and not force):
            return
        if ring.pending() and not force:
            return
        words = ring.segment.words
        w.final = (words[HEAD // 8], words[TAIL // 8], ring.dropped)
        ring.close()
        w.ring = None

    def _wait(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT
        while not condition():
            if time.monotonic() > deadline:
                raise GearshiftError(f"timed out waiting for {what}")
            self._poll()
            time.sleep(TICK)

    def _stderr(self, name: str) -> str:
        with contextlib.suppress(OSError):
            return (self.dir / f"{name}.err").read_text()[-4000:]
        return ""


def _chaos_plan(seconds: float, rng: random.Random) -> list[tuple[float, str]]:
    """(time into the run, what to kill): the controller every ~5 s, a worker every ~1 s, at
    least twice each."""
    controller = max(2, int(seconds // 5))
    plan = [
        (seconds * (k + rng.uniform(0.2, 0.8)) / controller, "controller")
        for k in range(controller)
    ]
    plan += [(seconds * rng.uniform(0.05, 0.95), "worker") for _ in range(max(2, int(seconds)))]
    return sorted(plan)


def _reap(proc: subprocess.Popen) -> int:
    try:
        return proc.wait(WAIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _leaked(namespace: str) -> list[str]:
    """The /dev/shm entries of `namespace` (segments, and the lock's `sem.` file)."""
    prefix = f"gearshift.{namespace}."
    return [n for n in os.listdir(SHM_DIR) if n.removeprefix("sem.").startswith(prefix)]


# -- the report --


def _report(h: _Harness, leaked: int) -> StressReport:
    sent = consumed = dropped = calls = 0
    mismatched = []
    for w in h.incarnations:
        started, finished = struct.unpack_from("<QQ", w.counters.read_bytes())
        calls += finished
        if w.final is None:
            continue  # never ready: it routed nothing
        head, tail, drops = w.final
        recorded = head + drops
        sent += started if recorded == started else finished
        if not finished <= recorded <= started:
            mismatched.append(w.index)
        consumed += tail
        dropped += drops
    journal = _Journal(h.dir)
    journal.refresh()
    lags, stalls, unpublished, walls, stall_max, dead_stall = [], [], 0, [0], 0, 0
    for w in h.incarnations:
        seen = []
        for kind, *values in (line.split() for line in w.log.read_text().splitlines()):
            if kind == "v":
                seen.append((int(values[0]), int(values[1])))
            elif kind == "s":
                stall, _, t_ns = map(int, values)
                stalls.append(stall)
                if any(start <= t_ns <= (end or math.inf) for start, end in h.downtime):
                    dead_stall = max(dead_stall, stall)
            elif kind in ("n", "exit"):
                walls.append(int(values[0]))
                stall_max = max(stall_max, int(values[1]))
        for version, t_ns in seen:
            published = journal.entries.get((w.device, version))
            unpublished += not published
            if published and (version, t_ns) != seen[0]:
                lags.append(t_ns - max(t for t, _ in published))
    readers = [_last_counts(h.dir / f"reader{i}.log") for i in range(len(h.readers))]
    stall_max = max([stall_max, *stalls])
    return StressReport(
        workers=h.config.workers,
        seconds=h.config.seconds,
        events_sent=sent,
        events_consumed=consumed,
        events_dropped=dropped,
        events_lost=sent - consumed - dropped,
        snapshots_published=len(journal.entries),
        torn_snapshots_accepted=sum(r[3] for r in readers),
        worker_kills=h.kills["worker"],
        controller_kills=h.kills["controller"],
        route_stall_ms_max=_ms(stall_max),
        propagation_ms_p99=_ms(np.percentile(lags, 99)) if lags else None,
        leaked_segments=leaked,
        details={
            "namespace": h.namespace,
            "route_calls": calls,
            "route_stall_ms_p999": _ms(_tail_percentile(stalls, calls, 0.999)),
            "route_stall_ms_max_controller_dead": _ms(dead_stall),
            "route_wall_ms_max": _ms(max(walls)),
            "controller_dead_seconds": round(
                sum(end - start for start, end in h.downtime if end) / 1e9, 2
            ),
            "worker_incarnations": len(h.incarnations),
            "controller_incarnations": h.controllers,
            "events_unattributed": sum(h.unattributed.values()),
            "snapshots_read": sum(r[0] for r in readers),
            "versions_verified": sum(r[1] for r in readers),
            "reads_refused": sum(r[2] for r in readers),
            "versions_routed_unpublished": unpublished,
            "counter_mismatches": mismatched,
        },
    )


def _ms(ns: float) -> float:
    return round(float(ns) / 1e6, 3)


def _tail_percentile(slow: list[int], calls: int, q: float) -> float:
    """The q-quantile of all calls' stalls, knowing only those over SLOW_NS (an upper bound
    SLOW_NS when fewer than (1 - q) of the calls are over it)."""
    rank = math.ceil((1 - q) * calls)
    return float(sorted(slow, reverse=True)[rank - 1]) if 0 < rank <= len(slow) else SLOW_NS


def _last_counts(path: Path) -> tuple[int, ...]:
    lines = [line for line in path.read_text().splitlines() if line.startswith("a ")]
    return tuple(map(int, lines[-1].split()[1:])) if lines else (0, 0, 0, 0)


# -- the processes --


class _Stop:
    """True once SIGTERM arrived or the harness (the parent) is gone."""

    def __init__(self) -> None:
        self.parent = os.getppid()
        self.requested = False
        signal.signal(signal.SIGTERM, self._request)

    def _request(self, *_: object) -> None:
        self.requested = True

    def __bool__(self) -> bool:
        return self.requested or os.getppid() != self.parent


def _write(fd: int, line: str) -> None:
    os.write(fd, f"{line}\n".encode())


def _open_log(path: str) -> int:
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)


def _worker(namespace: str, device: int, seed: list[int], log: str, counters: str) -> None:
    stop = _Stop()
    fd = _open_log(log)
    with open(counters, "r+b") as f:
        words = memoryview(mmap.mmap(f.fileno(), COUNTERS)).cast("Q")
    deadline = time.monotonic() + WAIT
    while not stop:
        try:
            client = gs.connect(namespace, device, background=False)
            break
        except (ControllerNotFound, NamespaceBusy):  # dead controller, or a lock it held
            if time.monotonic() > deadline:
                raise
            time.sleep(TICK)
    else:
        return
    try:
        profile = client.profile(PROFILE, DIMS)
        gc.freeze()  # what a latency-minded worker does after start-up: no full collections
        _write(fd, f"ready {client.slot}")
        _route(client, profile.route, words, fd, seed, stop)
    finally:
        client.close()


def _route(
    client: Client,
    route: Callable[..., Any],
    words: memoryview,
    fd: int,
    seed: list[int],
    stop: _Stop,
) -> None:
    """route() flat out, timing each call (see the module docstring), and the client's swap
    work (`tick`) between batches; logs `v VERSION T` when a call plans on a new version,
    `s STALL WALL T` for a stall over SLOW_NS and `n|exit WALL_MAX STALL_MAX` now and then
    (ns)."""
    rng = np.random.default_rng(seed)
    perf, cpu, usage, thread = time.perf_counter_ns, time.thread_time_ns, getrusage, RUSAGE_THREAD
    calls = wall_max = stall_max = version = 0
    report = tick = 0.0
    cpu0, blocked0 = cpu(), usage(thread).ru_nvcsw
    while not stop:
        now = time.monotonic()
        phase = np.random.default_rng([seed[0], int(now / PHASE_SECONDS)])
        centres = np.exp(phase.uniform(np.log([2, 16]), np.log([256, 8192])))
        sizes = np.clip(np.rint(centres * rng.lognormal(0, SPREAD, (BATCH, 2))), 1, [256, 8192])
        batch, seqs = sizes.astype(np.int64).T.tolist()  # flat int lists: nothing for the GC
        for b, s in zip(batch, seqs, strict=True):
            words[0] = calls + 1
            t0 = perf()
            plan = route(B=b, S=s)
            wall = perf() - t0
            cpu1, blocked1 = cpu(), usage(thread).ru_nvcsw
            calls += 1
            words[1] = calls
            stall = wall if blocked1 != blocked0 else min(wall, cpu1 - cpu0)
            cpu0, blocked0 = cpu1, blocked1
            if wall > wall_max:
                wall_max = wall
            if stall > stall_max:
                stall_max = stall
            if stall > SLOW_NS:
                _write(fd, f"s {stall} {wall} {time.monotonic_ns()}")
            if plan[0] != version:
                version = plan[0]
                _write(fd, f"v {version} {time.monotonic_ns()}")
        if now >= tick:
            tick = now + client.poll_interval
            client.tick()
        if now >= report:
            report = now + REPORT_SECONDS
            _write(fd, f"n {wall_max} {stall_max}")
    _write(fd, f"exit {wall_max} {stall_max}")


def _reader(namespace: str, devices: int, journal: str, log: str) -> None:
    """Read every device's snapshot in a loop; log `t DEVICE VERSION WHY` for a torn one and
    `a ACCEPTED VERSIONS REFUSED TORN` now and then."""
    stop = _Stop()
    fd = _open_log(log)
    known = _Journal(Path(journal))
    regions: dict[int, SnapshotRegion] = {}
    last: dict[int, tuple[int, object]] = {}
    accepted = versions = refused = torn = 0
    report = 0.0
    while not stop:
        for device in range(devices):
            region = regions.get(device)
            if region is None:
                with contextlib.suppress(FileNotFoundError):
                    region = regions[device] = SnapshotRegion.attach(namespace, device)
                continue
            try:
                snapshot = region.read()
            except PayloadError:
                refused += 1
                continue
            if snapshot is None:
                continue
            accepted += 1
            version, payload = snapshot
            previous = last.get(device, (0, None))
            why = _torn(device, version, payload, previous, known)
            if why:
                torn += 1
                _write(fd, f"t {device} {version} {why}")
            elif version != previous[0]:
                versions += 1
                last[device] = (version, payload)
        if (now := time.monotonic()) >= report:
            report = now + REPORT_SECONDS
            _write(fd, f"a {accepted} {versions} {refused} {torn}")
    _write(fd, f"a {accepted} {versions} {refused} {torn}")


def _torn(
    device: int, version: int, payload: object, previous: tuple[int, object], journal: _Journal
) -> str:
    """Why an accepted snapshot is not one the controller published ("" if it is)."""
    if version < previous[0]:
        return f"version_went_down_from_{previous[0]}"
    if version == previous[0]:
        return "" if payload == previous[1] else "another_payload_under_the_same_version"
    if not isinstance(payload, dict) or payload.get("device") != device:
        return "another_device"
    return "" if payload in journal.payloads(device, version) else "not_published"


class _Journal:
    """The run's publications: records (`_JOURNAL` + payload) in files `journal.*`, one per
    controller incarnation (a killed one may leave a partial last record), read as they grow."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.entries: dict[tuple[int, int], list[tuple[int, bytes]]] = {}
        self._offsets: dict[Path, int] = {}

    def refresh(self) -> None:
        for path in sorted(self.directory.glob("journal.*")):
            offset = self._offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            at = 0
            while at + _JOURNAL.size <= len(data):
                device, version, t_ns, length = _JOURNAL.unpack_from(data, at)
                end = at + _JOURNAL.size + length
                if end > len(data):
                    break
                payload = data[at + _JOURNAL.size : end]
                self.entries.setdefault((device, version), []).append((t_ns, payload))
                at = end
            self._offsets[path] = offset + at

    def payloads(self, device: int, version: int) -> list[object]:
        """The payloads journaled for (device, version), re-reading the files if none is."""
        if (device, version) not in self.entries:
            self.refresh()
        return [codec.unpack(p, len(p)) for _, p in self.entries.get((device, version), [])]


class _JournaledRegion(SnapshotRegion):
    """A device's snapshot region that journals each publication before its publishing store
    (the version is predicted as `publish` computes it: the writer is this process alone)."""

    journal = -1  # the fd of this controller incarnation's journal

    def publish(self, payload: object, at_least: int = 0) -> int:
        data = codec.pack(payload)
        version = max(self.version() + 1, at_least)
        device = int(self.segment.name.rpartition(".")[2])
        record = _JOURNAL.pack(device, version, time.monotonic_ns(), len(data))
        os.write(self.journal, record + data)
        return super().publish(payload, at_least)


class _JournaledController(Controller):
    region_type = _JournaledRegion


def _controller(namespace: str, settings: list[str], state_dir: str, journal: str) -> None:
    flag, stop = _Stop(), threading.Event()
    policy, config = load_configs(None, settings, namespace=namespace, state_dir=state_dir)
    _JournaledRegion.journal = _open_log(journal)
    controller = _JournaledController.open(config, policy)

    def watch() -> None:
        while not stop.wait(TICK):
            if flag:
                stop.set()

    threading.Thread(target=watch, daemon=True).start()
    controller.run(stop)


_ROLES: dict[str, Callable[..., None]] = {
    "worker": _worker,
    "reader": _reader,
    "controller": _controller,
}


# -- the command --


@click.command()
@click.option(
    "--workers",
    default=4,
    show_default=True,
    type=click.IntRange(1, 60),
    help="Worker processes routing flat out.",
)
@click.option(
    "--seconds",
    default=30.0,
    show_default=True,
    type=click.FloatRange(1.0),
    help="How long they route (start-up and shutdown come on top).",
)
@click.option(
    "--chaos",
    is_flag=True,
    help="SIGKILL workers (~1/s) and the controller (~every 5 s) at random; restart them.",
)
@click.option("--seed", default=0, show_default=True, help="Seed of the shapes and the chaos.")
@click.option(
    "--namespace",
    "-n",
    default="",
    metavar="NS",
    help="Namespace to run in (watch it with `gearshift status -n NS`); it must not exist "
    "[default: a fresh one].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the figures as one JSON object.")
def command(
    workers: int, seconds: float, chaos: bool, seed: int, namespace: str, as_json: bool
) -> None:
    """Stress the whole system: WORKERS processes route random 2-dim shapes through the real
    client, the controller decides every 0.1 s, snapshot readers verify every snapshot they
    accept. Exit status 1 if a snapshot was torn, an event lost, a segment leaked, or a
    route() call stalled over 1 ms."""

    def interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        report = run(StressConfig(workers, seconds, chaos, seed=seed, namespace=namespace))
    except GearshiftError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(1)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if as_json:
        click.echo(json.dumps(report.summary()))
    else:
        for key, value in [*report.summary().items(), *report.details.items()]:
            click.echo(f"{key:36} {value}")
    bad = report.violations()
    if bad:
        click.echo(f"FAILED: {', '.join(bad)}", err=True)
        sys.exit(1)


if __name__ == "__main__":
    _ROLES[sys.argv[1]](**json.loads(sys.argv[2]))
