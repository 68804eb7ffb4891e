"""The processes of a stress run: `python -m gearshift.tools.stress ROLE SPEC`, SPEC being the JSON
object of the role function's keyword arguments.

- worker: `gs.connect` and `Profile.route` flat out with random shapes on 2 dims (DIMS), whose
  centres move every PHASE_SECONDS (the same for every worker: they share the traffic, and the
  policy keeps adding and evicting gears). It runs the client's swap work itself (`tick`:
  re-registration, adoption, heartbeats) between batches, every `Client.poll_interval`, and
  freezes its start-up heap (`gc.freeze()`), so that neither a swap thread holding the GIL nor
  a collection of that heap stalls a call (why: docs/tools.md).
- reader: reads every device's snapshot region in a loop and checks each snapshot it accepts
  (`journal.torn`).
- controller: the real `Controller` publishing through `JournaledRegion`.

Each ends on SIGTERM or when its parent (the harness) is gone, and logs to its own file, one
line per write (a SIGKILL loses no line written; one it cuts short lacks its newline and is
not read), times in CLOCK_MONOTONIC ns:

    worker  ready SLOT                    connected, profile registered: routing starts
            v VERSION T                   the first route() planned on VERSION
            s STALL T                     a route() call that stalled over SLOW_NS
            n|exit WALL_MAX STALL_MAX INTERRUPTED   every REPORT_SECONDS, and at exit
    reader  t DEVICE VERSION WHY          a torn snapshot accepted
            a READS VERSIONS REFUSED TORN every REPORT_SECONDS, and at exit

A worker also stores its route() calls in its counter file (u64 words): `started` (0) before
each call, `finished` (1) after it.
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from resource import RUSAGE_THREAD, getrusage
from typing import Any

import numpy as np

import gearshift as gs
from gearshift.controller.config import load_configs
from gearshift.controller.controller import Controller
from gearshift.errors import ControllerNotFound, NamespaceBusy, PayloadError
from gearshift.shm import SnapshotRegion
from gearshift.tools.stress.journal import Journal, JournaledRegion, torn
from gearshift.worker.session import Client

DIMS = {"B": gs.Dim(max=256), "S": gs.Dim(max=8192)}
PROFILE = "stress"
PHASE_SECONDS = 1.0  # the traffic's centres move this often
SPREAD = 0.15  # log-normal spread of the raw sizes around a centre
BATCH = 1024  # route() calls between looks at the clock and the stop flag
SLOW_NS = 50_000  # a call that stalls longer is logged at once
LOST_CPU_NS = 50_000  # a call whose thread was off the CPU longer was interrupted
REPORT_SECONDS = 0.5
CONNECT_SECONDS = 30.0  # a worker started while the controller is down waits for it this long
COUNTERS = 64  # bytes of a counter file
STARTED, FINISHED = 0, 1  # its words


class _Stop:
    """True once SIGTERM arrived or the parent is gone."""

    def __init__(self) -> None:
        self.parent = os.getppid()
        self.requested = False
        signal.signal(signal.SIGTERM, self._request)

    def _request(self, *_: object) -> None:
        self.requested = True

    def __bool__(self) -> bool:
        return self.requested or os.getppid() != self.parent


class _Log:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def __call__(self, *fields: object) -> None:
        os.write(self.fd, (" ".join(map(str, fields)) + "\n").encode())


def worker(namespace: str, device: int, seed: list[int], log: str, counters: str) -> None:
    stop, write = _Stop(), _Log(log)
    with open(counters, "r+b") as f:
        words = memoryview(mmap.mmap(f.fileno(), COUNTERS)).cast("Q")
    deadline = time.monotonic() + CONNECT_SECONDS
    while not stop:
        try:
            client = gs.connect(namespace, device, background=False, require_controller=True)
            break
        except (ControllerNotFound, NamespaceBusy):  # no live controller, or a lock it held
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)
    else:
        return
    try:
        profile = client.profile(PROFILE, DIMS)
        gc.freeze()
        write("ready", client.slot)
        _route(client, profile.route, words, write, seed, stop)
    finally:
        client.close()


def _route(
    client: Client,
    route: Callable[..., Any],
    words: memoryview,
    write: _Log,
    seed: list[int],
    stop: _Stop,
) -> None:
    """route() flat out, timing each call: a call that blocked (a voluntary context switch)
    or kept its CPU stalled for its wall time; one that lost its CPU without blocking was
    interrupted, and is only counted (see the package docstring)."""
    rng = np.random.default_rng(seed)
    perf, cpu, usage, thread = time.perf_counter_ns, time.thread_time_ns, getrusage, RUSAGE_THREAD
    calls = wall_max = stall_max = interrupted = version = 0
    report = tick = 0.0
    cpu0, blocked0 = cpu(), usage(thread).ru_nvcsw
    while not stop:
        now = time.monotonic()
        phase = np.random.default_rng([seed[0], int(now / PHASE_SECONDS)])
        centres = np.exp(phase.uniform(np.log([2, 16]), np.log([256, 8192])))
        sizes = np.clip(np.rint(centres * rng.lognormal(0, SPREAD, (BATCH, 2))), 1, [256, 8192])
        batch, seqs = sizes.astype(np.int64).T.tolist()  # flat int lists: nothing for the GC
        for b, s in zip(batch, seqs, strict=True):
            words[STARTED] = calls + 1
            t0 = perf()
            plan = route(B=b, S=s)
            wall = perf() - t0
            cpu1, blocked1 = cpu(), usage(thread).ru_nvcsw
            calls += 1
            words[FINISHED] = calls
            if blocked1 == blocked0 and wall - (cpu1 - cpu0) > LOST_CPU_NS:
                interrupted += 1
            else:
                if wall > stall_max:
                    stall_max = wall
                if wall > SLOW_NS:
                    write("s", wall, time.monotonic_ns())
            cpu0, blocked0 = cpu1, blocked1
            if wall > wall_max:
                wall_max = wall
            if plan[0] != version:
                version = plan[0]
                write("v", version, time.monotonic_ns())
        if now >= tick:
            tick = now + client.poll_interval
            client._tick()
        if now >= report:
            report = now + REPORT_SECONDS
            write("n", wall_max, stall_max, interrupted)
    write("exit", wall_max, stall_max, interrupted)


def reader(namespace: str, devices: int, journal: str, log: str) -> None:
    stop, write, known = _Stop(), _Log(log), Journal(Path(journal))
    regions: dict[int, SnapshotRegion] = {}
    last: dict[int, tuple[int, object]] = {}
    reads = versions = refused = torn_ = 0
    report = 0.0
    while not stop:
        for device in range(devices):
            region = regions.get(device)
            if region is None:  # not published yet
                with contextlib.suppress(FileNotFoundError):
                    regions[device] = SnapshotRegion.attach(namespace, device)
                continue
            try:
                snapshot = region.read()
            except PayloadError:  # no consistent copy within its retries: refused, not torn
                refused += 1
                continue
            if snapshot is None:
                continue
            reads += 1
            previous = last.get(device, (0, None))
            why = torn(device, *snapshot, previous, known)
            if why:
                torn_ += 1
                write("t", device, snapshot.version, why)
            elif snapshot.version != previous[0]:
                versions += 1
                last[device] = snapshot
        if (now := time.monotonic()) >= report:
            report = now + REPORT_SECONDS
            write("a", reads, versions, refused, torn_)
    write("a", reads, versions, refused, torn_)


class _JournaledController(Controller):
    region_type = JournaledRegion


def controller(namespace: str, settings: list[str], state_dir: str, journal: str) -> None:
    flag, stop = _Stop(), threading.Event()
    policy, config = load_configs(None, settings, namespace=namespace, state_dir=state_dir)
    JournaledRegion.journal = os.open(journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    running = _JournaledController.open(config, policy)

    def watch() -> None:  # the loop waits on an Event; the flag is set by a signal handler
        while not stop.wait(0.01):
            if flag:
                stop.set()

    threading.Thread(target=watch, daemon=True).start()
    running.run(stop)


ROLES: dict[str, Callable[..., None]] = {
    "worker": worker,
    "reader": reader,
    "controller": controller,
}


@dataclass
class WorkerLog:
    """What a worker's log says (see the module docstring)."""

    slot: int | None = None
    versions: list[tuple[int, int]] = field(default_factory=list)  # (version, first routed ns)
    stalls: list[tuple[int, int]] = field(default_factory=list)  # (stall ns, when) > SLOW_NS
    wall_max: int = 0
    stall_max: int = 0
    interrupted: int = 0

    @classmethod
    def read(cls, path: Path) -> WorkerLog:
        """The log so far; the maxima include the stalls logged after the last count (a
        killed worker's)."""
        out = cls()
        for kind, *values in (line.split() for line in _lines(path)):
            if kind == "ready":
                out.slot = int(values[0])
            elif kind == "v":
                out.versions.append((int(values[0]), int(values[1])))
            elif kind == "s":
                stall, t_ns = map(int, values)
                out.stalls.append((stall, t_ns))
                out.wall_max, out.stall_max = max(out.wall_max, stall), max(out.stall_max, stall)
            elif kind in ("n", "exit"):
                wall, stall, out.interrupted = map(int, values)
                out.wall_max, out.stall_max = max(out.wall_max, wall), max(out.stall_max, stall)
        return out


def reader_counts(path: Path) -> tuple[int, int, int, int]:
    """A reader's last (reads, versions verified, reads refused, torn)."""
    counts = [line.split()[1:] for line in _lines(path) if line[:2] == "a "]
    reads, versions, refused, torn_ = map(int, counts[-1]) if counts else (0, 0, 0, 0)
    return reads, versions, refused, torn_


def _lines(path: Path) -> list[str]:
    """The complete lines of a log (a write cut short by a kill lacks its newline)."""
    return path.read_text().split("\n")[:-1]
