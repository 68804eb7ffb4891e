"""Fuzzing every boundary: `gearshift stress --fuzz SECONDS`, and tests/tools/stress/test_fuzz.py.

Each boundary of `boundaries.boundaries()` is a hypothesis strategy of cases (arbitrary bytes and
well-formed but wrong values: ring header and records, snapshot header and payload, slot table
words, mailbox messages, registration fields, the state file, the TOML configuration, a trace
CSV; the deployment faults of `fault_boundaries.faults()`: oversize registrations, a hostile
state directory; a fleet store's objects, `fleet_boundary.fleet()`) and an attack that writes
one case into a `target.Live` namespace (or a file, a directory) and lets it run; `run` sizes
each boundary by examples (the tests) or by time (the command) and returns a `target.Tally` per
boundary. `real_processes` attacks a `gearshift serve` process and a worker
process from the outside. Hypothesis only generates: a failure is tallied, not raised, so
nothing shrinks it. Hypothesis is the `test` extra's: it is imported only when a run starts
(`require` says what to install when it is missing).
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from contextlib import ExitStack

import numpy as np

from gearshift.clock import MonotonicClock
from gearshift.errors import GearshiftError
from gearshift.shm import EventRing, Registry, SnapshotRegion, control
from gearshift.tools.stress import boundaries, fault_boundaries, fleet_boundary
from gearshift.tools.stress.target import DIMS, SIZES, WALL, Tally, objects, remove, serial


def run(examples: int | None = None, seconds: float | None = None,
        only: list[str] | None = None) -> dict[str, Tally]:
    """Every boundary's tally: `examples` cases each (the tests'), or batches of cases until
    `seconds` are spent, shared equally (`gearshift stress --fuzz`)."""
    require()
    from hypothesis import HealthCheck, Phase, given, settings

    chosen = [b for b in (*boundaries.boundaries(), *fault_boundaries.faults(),
                          *fleet_boundary.fleet())
              if only is None or b.name in only]
    tallies = {b.name: Tally() for b in chosen}
    quiet = logging.getLogger("gearshift")
    level, quiet.level = quiet.level, logging.CRITICAL  # the refusals log by design
    gc.freeze()  # the harness's heap (pytest, hypothesis) is no controller's: GC skips it
    try:
        for b in chosen:
            tally, deadline = tallies[b.name], WALL.now() + (seconds or 0) / len(chosen)
            batch = examples or 25
            while True:
                body = settings(max_examples=batch, deadline=None, database=None,
                                phases=[Phase.generate],
                                suppress_health_check=list(HealthCheck))(
                    given(b.cases)(_body(b, tally)))
                body()
                if examples is not None or WALL.now() >= deadline:
                    break
    finally:
        quiet.level = level
        gc.unfreeze()
    return tallies


def require() -> None:
    """Raise an ImportError that says what to install if hypothesis is missing."""
    boundaries.strategies()


def everything(seconds: float) -> dict[str, Tally]:
    """`run` for most of `seconds`, then `real_processes` for the rest (2..10 s), then the
    deployment faults (`faults.tally`, `lockfaults.tally`: a few seconds more)."""
    from gearshift.tools.stress import faults, lockfaults

    outside = min(10.0, max(2.0, seconds / 5))
    tallies = run(seconds=max(seconds - outside, 1.0))
    tallies["real processes"] = Tally()
    real_processes(outside, tallies["real processes"])
    faults.tally(tallies)
    lockfaults.tally(tallies)
    return tallies


def table(tallies: dict[str, Tally]) -> str:
    """The figures, one row per boundary, then the first failures of each."""
    head = f"{'boundary':22}" + "".join(f"{f:>15}" for f in Tally.FIGURES)
    rows = [f"{name:22}" + "".join(f"{v:>15}" for v in t.figures().values())
            for name, t in tallies.items()]
    notes = [f"  {name}: {f}" for name, t in tallies.items() for f in t.failures[:3]]
    return "\n".join([head, *rows, *notes])


def _body(boundary: boundaries.Boundary, tally: Tally) -> Callable[[object], None]:
    def one(case: object) -> None:
        tally.cases += 1
        try:
            boundary.attack(case, tally)
        except Exception as e:  # the harness's own failure: count it rather than stop the run
            tally.fail("crashes", f"{boundary.name}: {type(e).__name__}: {e}")

    return one


def real_processes(seconds: float, tally: Tally) -> None:
    """`gearshift serve` and a worker process, attacked from this one for `seconds`: the
    controller must keep beating, answer `gearshift status`, stop on SIGTERM with status 0 and
    leave nothing once the worker is gone; the worker's requests must not raise."""
    namespace = f"fuzzproc{os.getpid()}x{next(serial)}"
    with tempfile.TemporaryDirectory(prefix="gearshift-fuzz-") as directory, ExitStack() as stack:
        # a file: a pipe nobody reads meanwhile could fill and block the controller
        log = stack.enter_context(open(os.path.join(directory, "serve.log"), "w+"))
        serve = subprocess.Popen(
            [sys.executable, "-m", "gearshift", "serve", "--log-level", "WARNING", "-n",
             namespace, "--state-dir", directory, "--set", "scan_interval_seconds=0.05"],
            stdout=subprocess.DEVNULL, stderr=log, text=True)
        worker = None
        try:
            registry = _wait_for(namespace, serve)
            worker = subprocess.Popen(
                [sys.executable, "-m", "gearshift.tools.stress.fuzz", namespace,
                 str(seconds + 1.0)], stdout=subprocess.PIPE, text=True)
            assert worker.stdout is not None
            if worker.stdout.readline().strip() != "ready":
                raise GearshiftError("the fuzz worker did not start")
            attack_processes(namespace, registry, seconds, tally)
            status = subprocess.run([sys.executable, "-m", "gearshift", "status", "-n",
                                     namespace], capture_output=True, text=True, timeout=60)
            if status.returncode != 0:
                tally.fail("crashes", f"status: exit {status.returncode}: {status.stderr[-200:]}")
            registry.close()
            errors = worker.stdout.readline().split()  # "errors N" once it is done
            worker.wait(60)
            if errors[:1] != ["errors"] or errors[1:] != ["0"]:
                tally.fail("request_errors", f"the worker process reported {errors}")
        finally:
            if worker is not None and worker.poll() is None:
                worker.kill()
                worker.wait(30)
            if worker is not None and worker.stdout is not None:
                worker.stdout.close()
            serve.send_signal(signal.SIGTERM)
            try:
                code = serve.wait(60)
            except subprocess.TimeoutExpired:
                serve.kill()
                code = serve.wait(30)
            log.seek(0)
            written = log.read()
            if code != 0:
                tally.fail("crashes", f"serve: exit {code}: {written[-300:]}")
            if written.count("\n") > 100:  # one hostile slot must not flood the log
                tally.fail("stalls", f"serve logged {written.count(chr(10))} lines")
        left = objects(namespace)
        if left:
            tally.fail("leaked", ", ".join(left))
            remove(namespace)


def _wait_for(namespace: str, serve: subprocess.Popen[str]) -> Registry:
    """The namespace's registry once its controller is alive (30 s at most, while `serve`
    runs)."""
    deadline = WALL.now() + 30.0
    while True:
        try:
            registry = Registry.attach(namespace)
            if registry.controller().alive:
                return registry
            registry.close()
        except GearshiftError:
            if WALL.now() > deadline or serve.poll() is not None:
                raise
        WALL.sleep(0.01)


def attack_processes(namespace: str, registry: Registry, seconds: float, tally: Tally) -> None:
    """From outside: garbage into the worker's ring header and slot words, raw payloads into
    the snapshot region, junk into every mailbox, while the controller beats on."""
    rng = np.random.default_rng(0)
    deadline, beat = WALL.now() + seconds, registry.controller().heartbeat_ns
    beaten = WALL.now()  # when the controller's heartbeat last moved
    worker_slot = next(i.slot for i in registry.slots() if i.alive)
    attacker = registry.claim_slot(0)
    rings = EventRing.attach(namespace, worker_slot)
    region = SnapshotRegion.attach(namespace, 0)
    try:
        while WALL.now() < deadline:
            tally.cases += 1
            word = int(rng.choice([1, 2, 3, 8, 16, 24]))  # layout, capacity, size, head, tail..
            rings._words[word] = int(rng.integers(0, 2**63))
            boundaries.publish_raw(region, rng.bytes(int(rng.integers(0, 300))))
            words = registry._words
            slot_base = (control.TABLE + attacker * registry._slot_size) // 8
            words[slot_base + int(rng.integers(1, 7))] = int(rng.integers(0, 2**63))
            registry.requests(attacker).post({"op": "register", "junk": rng.bytes(64)})
            WALL.sleep(0.02)
            now_beat = registry.controller().heartbeat_ns
            if now_beat != beat:
                beat, beaten = now_beat, WALL.now()
            elif WALL.now() - beaten > 1.0:  # its loop runs every 10 ms: stopped, not slow
                tally.fail("stalls", "the controller's heartbeat stopped for over 1 s")
                beaten = WALL.now()
    finally:
        rings.close()
        region.close()
        registry.release_slot(attacker)


def _worker(namespace: str, seconds: float) -> None:
    from gearshift.worker.session import Client

    logging.getLogger("gearshift").setLevel(logging.ERROR)  # the attack's warnings are expected
    clock = MonotonicClock()
    client = Client(Registry.attach(namespace), 0, clock=clock)
    profile = client.profile("fuzz", DIMS)
    print("ready", flush=True)
    errors, deadline = 0, clock.now() + seconds
    while clock.now() < deadline:
        for s, b in SIZES:
            try:
                profile.route(S=s, B=b)
            except Exception:
                errors += 1
        clock.sleep(0.001)
    client.close()
    print("errors", errors, flush=True)


if __name__ == "__main__":  # NS SECONDS: the worker process of `real_processes`
    _worker(sys.argv[1], float(sys.argv[2]))
