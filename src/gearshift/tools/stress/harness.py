"""The harness of a stress run: starts the processes (`roles.py`), each in its own session (a
Ctrl-C reaches only the harness), kills and restarts them on the chaos plan, and keeps the
books (`tally.py`).

Chaos: about once a second a random routing worker is SIGKILLed and a new one started; about
every 5 s the controller is SIGKILLed and restarted 0.2-0.8 s later on the same state file;
at least twice each. Everything lives in one fresh namespace and a temporary directory (logs,
counter files, journal, state file), both removed at the end, also after an error, Ctrl-C or
SIGTERM (a SIGKILLed harness leaves that to `gearshift cleanup`; its children stop when they
see it gone).

Pod-shaped (`pod`): the controller and every worker each run in a pid namespace of their own
(`unshare --pid --fork --mount-proc --kill-child`, as root), sharing /dev/shm, as a Kubernetes
sidecar and its workers do without shareProcessNamespace; liveness is then judged by leases
(shm/lease.py), so a restarted controller takes the namespace over once its predecessor's
lease expired. Two more invariants are watched throughout: the control segment is never
replaced under live participants (`namespace_replaced`), and the controller word never passes
from one live controller to another (`controllers_at_once`: only after the harness killed it).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gearshift.controller import status
from gearshift.errors import ControllerNotFound, GearshiftError
from gearshift.shm import EventRing, Registry, SlotState, cleanup, lease, names
from gearshift.shm.ring import HEAD, TAIL
from gearshift.shm.segment import SHM_DIR
from gearshift.tools.stress import roles
from gearshift.tools.stress.report import StressReport
from gearshift.tools.stress.tally import Incarnation, Tally

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
POD = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")  # a pid namespace each
WAIT = 30.0  # seconds: the bound of every wait for a process
TICK = 0.01  # the harness's loop
STATUS_SECONDS = 0.2  # the controller's status document is read this often


@dataclass(frozen=True)
class StressConfig:
    workers: int = 4
    seconds: float = 30.0
    chaos: bool = False
    devices: int = 2  # workers are spread over them; one reader per device reads them all
    seed: int = 0
    namespace: str = ""  # "" -> a fresh one, unique to the run
    pod: bool = False  # the controller and each worker in a pid namespace of its own


def run(config: StressConfig) -> StressReport:
    """Run the stress test; every process and segment it started is gone when it returns or
    raises (GearshiftError when a process fails on its own or does not start in time)."""
    harness = _Harness(config)
    try:
        harness.start()
        harness.drive()
        return harness.finish()
    finally:
        harness.teardown()


class _Harness:
    def __init__(self, config: StressConfig) -> None:
        self.config = config
        self.namespace = names.validate(config.namespace or f"stress-{os.urandom(6).hex()}")
        self.dir = Path(tempfile.mkdtemp(prefix="gearshift-stress-"))
        self.rng = random.Random(config.seed)
        self.tally = Tally(self.namespace, self.dir, config.workers, config.seconds)
        self.procs: list[subprocess.Popen] = []  # every process started
        self.controller: subprocess.Popen | None = None
        self.controller_up = False
        self.restart_at: float | None = None
        self.readers: list[subprocess.Popen] = []
        self.current: list[Incarnation] = []  # the worker of each index
        self.registry: Registry | None = None
        self.next_status = 0.0
        self.owner = 0  # the controller word's identity last seen (0: none)
        self.killed: set[int] = set()  # identities of controllers the harness killed
        self.ending = False  # finish() under way: the namespace may go

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
        plan = chaos_plan(self.config.seconds, self.rng) if self.config.chaos else []
        while (now := time.monotonic() - began) < self.config.seconds:
            self._poll()
            if plan and plan[0][0] <= now and self._kill(plan[0][1]):
                plan.pop(0)
            time.sleep(TICK)
        self._wait(lambda: self.controller_up, "the controller to restart")

    def finish(self) -> StressReport:
        """Stop readers and workers (SIGTERM), then the controller, whose final drain and
        cleanup must leave nothing behind; then count."""
        ending = [*self.readers, *(w.proc for w in self.current)]
        for proc in ending:
            self._terminate(proc)
        for proc in ending:
            _reap(proc)
        if self.config.pod:  # killed workers' leases expire: the controller reclaims them
            deadline = time.monotonic() + lease.LEASE + WAIT
            while not self._all_free():
                if time.monotonic() > deadline:
                    raise GearshiftError("timed out waiting for the dead workers' slots")
                time.sleep(TICK)
        self.ending = True
        assert self.controller is not None
        self._terminate(self.controller)
        if _reap(self.controller) != 0:
            raise GearshiftError(f"the controller failed at exit:\n{self._stderr('controller')}")
        for w in self.tally.incarnations:
            self._finalize(w, force=True)
        return self.tally.count(len(self.readers), leaked=len(_entries(self.namespace)))

    def teardown(self) -> None:
        """Kill whatever still runs, unmap, remove the namespace and the temporary directory."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for w in self.tally.incarnations:
            if w.ring is not None:
                w.ring.close()
        if self.registry is not None:
            self.registry.close()
        with contextlib.suppress(GearshiftError):
            cleanup(self.namespace)
        shutil.rmtree(self.dir, ignore_errors=True)

    # processes

    def _spawn(self, role: str, name: str, **spec: Any) -> subprocess.Popen:
        isolated = self.config.pod and role in ("controller", "worker")
        with open(self.dir / f"{name}.err", "ab") as err:
            proc = subprocess.Popen(
                [*(POD if isolated else ()), sys.executable, "-m", "gearshift.tools.stress",
                 role, json.dumps(spec)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
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
            journal=str(self.dir / f"journal.{self.tally.controllers}"),
        )
        self.tally.controllers += 1
        self.controller_up = False
        self.restart_at = None

    def _start_worker(self, index: int) -> Incarnation:
        number = len(self.tally.incarnations)
        counters = self.dir / f"worker{index}.{number}.counters"
        counters.write_bytes(bytes(roles.COUNTERS))
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
        self.tally.incarnations.append(Incarnation(index, device, proc, log, counters))
        return self.tally.incarnations[-1]

    def _kill(self, what: str) -> bool:
        """SIGKILL the controller (restarted after a random pause) or a random routing worker
        (replaced at once); False when there is none to kill now."""
        if what == "controller":
            if not self.controller_up:
                return False
            assert self.controller is not None
            self.controller.kill()  # (pod: unshare's child dies with it, --kill-child)
            self.controller.wait()
            self.killed.add(self.owner)
            self.controller_up = False
            self.tally.downtime.append([time.monotonic_ns(), 0])
            self.restart_at = time.monotonic() + self.rng.uniform(0.2, 0.8)
        else:
            routing = [w for w in self.current if w.ring is not None]
            if not routing:
                return False
            victim = self.rng.choice(routing)
            victim.proc.kill()
            victim.proc.wait()
            self.current[victim.index] = self._start_worker(victim.index)
        self.tally.kills[what] += 1
        return True

    def _poll(self) -> None:
        """Follow the processes: controller restarts and ownership, workers' readiness, final
        ring counters, status documents; a process that ended on its own is a failure."""
        if self.restart_at is not None and time.monotonic() >= self.restart_at:
            self._start_controller()
        assert self.controller is not None
        if self.controller.poll() is not None and self.restart_at is None:
            raise GearshiftError(f"the controller exited:\n{self._stderr('controller')}")
        current = self._owner_is_current()  # every poll: it watches the invariants too
        if not self.controller_up and current:
            self.controller_up = True
            if self.tally.downtime and not self.tally.downtime[-1][1]:
                self.tally.downtime[-1][1] = time.monotonic_ns()
        for i, proc in enumerate(self.readers):
            if proc.poll() is not None:
                raise GearshiftError(f"reader {i} exited:\n{self._stderr(f'reader{i}')}")
        for w in self.current:
            if w.proc.poll() is not None:
                raise GearshiftError(
                    f"worker {w.index} exited:\n{self._stderr(f'worker{w.index}')}"
                )
            if w.ring is None and (slot := roles.WorkerLog.read(w.log).slot) is not None:
                w.ring = EventRing.attach(self.namespace, slot)
        for w in self.tally.incarnations:
            self._finalize(w)
        if time.monotonic() >= self.next_status:
            self.next_status = time.monotonic() + STATUS_SECONDS
            doc = status.read(self.namespace)
            if doc is not None:
                unattributed = doc["events"]["unknown"] + doc["events"]["invalid"]
                self.tally.unattributed[doc["pid"]] = unattributed

    def _owner_is_current(self) -> bool:
        """Whether the controller word names the controller last started, alive; counts a word
        that passed from one live controller to another, and a control segment replaced."""
        if self.registry is not None and self.registry.segment.displaced():
            if not self.ending:
                self.tally.namespace_replaced += 1
            self.registry.close()
            self.registry = None
        if self.registry is None:
            try:
                self.registry = Registry.attach(self.namespace)
            except ControllerNotFound:
                return False
        self.tally.discarded = max(self.tally.discarded, self.registry.discarded)
        info = self.registry.controller()
        if info.ident != self.owner:
            if self.owner and info.ident and self.owner not in self.killed:
                self.tally.controllers_at_once += 1
            self.owner = info.ident
        if not info.alive or info.ident in self.killed:
            return False
        assert self.controller is not None
        return info.foreign if self.config.pod else info.pid == self.controller.pid

    def _all_free(self) -> bool:
        assert self.registry is not None
        return all(i.state == SlotState.FREE for i in self.registry.slots())

    def _terminate(self, proc: subprocess.Popen) -> None:
        """SIGTERM `proc`; in a pod, the process unshare forked (unshare would die of it and
        SIGKILL its child)."""
        if self.config.pod and proc not in self.readers:
            with contextlib.suppress(OSError, ValueError):
                children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text()
                os.kill(int(children.split()[0]), signal.SIGTERM)
                return
        proc.terminate()

    def _finalize(self, w: Incarnation, force: bool = False) -> None:
        """Read a ring's counters once they are final (its worker dead, the ring drained; or
        `force`, at the end) and unmap it."""
        ring = w.ring
        if ring is None or w.final is not None:
            return
        if not force and (w.proc.poll() is None or ring.pending()):
            return
        w.final = (ring.segment.words[HEAD // 8], ring.segment.words[TAIL // 8], ring.dropped)
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


def chaos_plan(seconds: float, rng: random.Random) -> list[tuple[float, str]]:
    """(time into the run, "controller" | "worker") to kill, in time order: the controller
    every ~5 s, a worker every ~1 s, at least twice each."""
    times = max(2, int(seconds // 5))
    plan = [(seconds * (k + rng.uniform(0.2, 0.8)) / times, "controller") for k in range(times)]
    plan += [(seconds * rng.uniform(0.05, 0.95), "worker") for _ in range(max(2, int(seconds)))]
    return sorted(plan)


def _reap(proc: subprocess.Popen) -> int:
    try:
        return proc.wait(WAIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def _entries(namespace: str) -> list[str]:
    """The /dev/shm entries of `namespace`: its segments, and its lock's `sem.` file."""
    prefix = f"gearshift.{namespace}."
    return [n for n in os.listdir(SHM_DIR) if n.removeprefix("sem.").startswith(prefix)]
