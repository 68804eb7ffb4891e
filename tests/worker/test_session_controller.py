"""The client's session across its controller's life: one killed and restarted, an embedded
one, the real controller's gears, `gearshift serve` started after its workers, never started,
or stopped before they leave."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from fakeclock import FakeClock

import gearshift as gs
from gearshift.controller import PolicyConfig
from gearshift.controller.statefile import STATE_FILE
from gearshift.shm import Registry, cleanup, names
from gearshift.worker import Client
from worker import procs
from worker.fake_controller import WAIT, ServingClock, serve, wait_until
from worker.procs import DECODE


def test_controller_killed_then_restarted(
    namespace: str, mp, spawn, caplog: pytest.LogCaptureFixture
) -> None:
    """Killed: routing goes on on the last snapshot, without blocking or raising, with a
    rate-limited warning. Restarted: the profile registers again and new snapshots arrive."""
    children = []  # (child, its stop event): a killed child may die holding its events' locks

    def start(create: bool, gears: dict) -> tuple:
        ready, stop, registered = mp.Event(), mp.Event(), mp.Queue()
        child = spawn(serve, namespace, create, gears, ready, registered, stop)
        children.append((child, stop))
        assert ready.wait(WAIT)
        return child, registered

    first, registered = start(True, {"decode": {"BATCHSIZE": [4, 64], "SEQLEN": [1024, 8192]}})
    clock = FakeClock()
    client = Client(
        Registry.attach(namespace), 0, clock=clock, background=False, register_timeout=0
    )
    try:
        prof = client.profile("decode", DECODE)
        wait_until(lambda: prof.registered, client._tick)
        assert registered.get(timeout=WAIT) == (client.slot, prof.id, "decode")
        assert prof.route(BATCHSIZE=3, SEQLEN=3).gears == {"BATCHSIZE": 4, "SEQLEN": 1024}

        os.kill(first.pid, signal.SIGKILL)
        first.join(WAIT)
        caplog.set_level(logging.WARNING, "gearshift")
        for _ in range(150):  # 150 s of virtual time: warnings at 0, 60 and 120 s
            client._tick()
            assert prof.route(BATCHSIZE=50, SEQLEN=2000).gears == {"BATCHSIZE": 64, "SEQLEN": 8192}
            clock.advance(1.0)
        warnings = [r for r in caplog.records if "no live controller" in r.getMessage()]
        assert len(warnings) == 3

        _, registered = start(False, {"decode": {"BATCHSIZE": [2, 64], "SEQLEN": [512, 8192]}})
        wait_until(lambda: prof.registered and prof.version > 1, client._tick)
        assert registered.get(timeout=WAIT) == (client.slot, prof.id, "decode")
        assert prof.route(BATCHSIZE=2, SEQLEN=3).gears == {"BATCHSIZE": 2, "SEQLEN": 512}
    finally:
        client.close()
        for child, stop in children:
            if child.is_alive():
                stop.set()
                child.join(WAIT)
        cleanup(namespace)


# -- with the real controller --


def test_embedded_connect_starts_a_controller_in_process_and_keeps_no_state(
    namespace: str, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    client = gs.connect(namespace=namespace, device=0, embedded=True)
    try:
        assert client.registry.controller().pid == os.getpid()
        prof = client.profile("decode", DECODE)
        wait_until(lambda: prof.registered and prof.version >= 1)
        assert prof.route(BATCHSIZE=13, SEQLEN=700).gears == {"BATCHSIZE": 16, "SEQLEN": 1024}
        with gs.connect(namespace=namespace, device=0) as second:  # finds it running
            assert second.profile("decode", DECODE).registered
    finally:
        client.close()
    assert not [n for n in os.listdir("/dev/shm") if namespace in n]  # it removed the namespace
    assert not list(tmp_path.iterdir())  # no state file under the user's state directory
    assert not list(Path(tempfile.gettempdir()).glob(f"gearshift-{namespace}-*"))


def test_an_embedded_controller_keeps_its_state_in_state_dir_when_asked(
    namespace: str, tmp_path: Path
) -> None:
    gears = {"BATCHSIZE": gs.Dim(gears=[1, 64], max=64)}
    with gs.connect(namespace, embedded=True, state_dir=str(tmp_path)) as client:
        prof = client.profile("decode", gears)
        wait_until(lambda: prof.version >= 1)
        first = prof.version
    assert STATE_FILE in [p.name for p in tmp_path.iterdir()]
    with gs.connect(namespace, embedded=True, state_dir=str(tmp_path)) as client:
        prof = client.profile("decode", gears)
        wait_until(lambda: prof.version > first)  # versions go on from the state file


def test_gears_the_real_controller_learns_reach_the_client(namespace: str, tmp_path) -> None:
    from gearshift.controller.config import ControllerConfig
    from gearshift.controller.controller import Controller

    policy = PolicyConfig(
        check_interval_seconds=1.0, update_interval_seconds=10.0, recent_use_protect_seconds=1.0
    )
    config = ControllerConfig(namespace=namespace, state_dir=str(tmp_path))
    clock = ServingClock(lambda: None, start=1000.0)
    controller = Controller.open(config, policy, clock=clock)
    clock.serve = controller.step  # the controller answers while the client waits
    try:
        with Client(Registry.attach(namespace), 0, clock=clock, background=False) as client:
            prof = client.profile("decode", {"BATCHSIZE": gs.Dim(gears=[1, 64], max=64)})
            assert prof.registered and prof.gears == {"BATCHSIZE": (1, 64)}
            first = prof.version
            for _ in range(50):
                assert prof.route(BATCHSIZE=33).gears == {"BATCHSIZE": 64}
            clock.advance(11.0)
            controller.step()  # drains, folds, and decides: 33 pads 48 % on 64
            client._tick()
            assert prof.version > first and 33 in prof.gears["BATCHSIZE"]
            assert prof.route(BATCHSIZE=33).gears == {"BATCHSIZE": 33}
            clock.advance(1.0)
            controller.step()
            assert controller.registry.slots()[client.slot].applied_version == prof.version
    finally:
        controller.close()


def _serve(namespace: str, state_dir: Path, *options: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "gearshift", "serve", "-n", namespace]
    command += ["--state-dir", str(state_dir), "--log-level", "WARNING", *options]
    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True)


def test_a_worker_started_before_its_controller_adopts_its_first_snapshot(
    namespace: str, mp, spawn, tmp_path: Path
) -> None:
    results, stop = mp.Queue(), mp.Event()
    child = spawn(procs.route_on, namespace, (1536, 4096), WAIT, results, stop, 200)  # seed's
    initial = {"SEQLEN": procs.PREFILL["SEQLEN"].initial_gears}
    assert results.get(timeout=WAIT) == ("started", None, 0, initial)
    kind, unrecorded = results.get(timeout=WAIT)  # the worker serves with no controller
    assert kind == "serving" and unrecorded >= 200
    seed = tmp_path / "gears.json"
    seed.write_text(json.dumps({"devices": {"0": {"prefill": {"SEQLEN": [1536, 4096]}}}}))
    controller = _serve(namespace, tmp_path / "state", "--initial-gears", str(seed))
    try:
        kind, version, gears, slot = results.get(timeout=WAIT)
        assert (kind, version, gears) == ("version", 1, {"SEQLEN": (1536, 4096)})
        assert slot is not None
        wait_until(lambda: _consumed(namespace, slot) > 0)  # its requests reach the controller
        stop.set()
        kind, routes, version, unrecorded = results.get(timeout=WAIT)
        assert kind == "done" and version == 1 and routes > unrecorded > 0
        child.join(WAIT)
        assert child.exitcode == 0
    finally:
        controller.send_signal(signal.SIGTERM)
        _, err = controller.communicate(timeout=WAIT)
    assert controller.returncode == 0, err
    assert not [n for n in os.listdir("/dev/shm") if namespace in n]


def test_a_worker_whose_controller_never_starts_serves_throughout(
    namespace: str, mp, spawn
) -> None:
    results, stop = mp.Queue(), mp.Event()
    child = spawn(procs.route_on, namespace, (3, 700, 1500), WAIT, results, stop, 500)
    kind, slot, version, _ = results.get(timeout=WAIT)
    assert (kind, slot, version) == ("started", None, 0)
    assert results.get(timeout=WAIT)[0] == "serving"  # 500 requests, a few swap-thread ticks
    stop.set()
    kind, routes, version, unrecorded = results.get(timeout=WAIT)
    assert (kind, version) == ("done", 0) and routes == unrecorded > 0
    child.join(WAIT)
    assert child.exitcode == 0
    assert not [n for n in os.listdir("/dev/shm") if namespace in n]


def _consumed(namespace: str, slot: int) -> int:
    from gearshift.controller import status

    doc = status.read(namespace) or {"workers": []}
    return sum(w["consumed"] for w in doc["workers"] if w["slot"] == slot)


def _controller_alive(namespace: str) -> bool:
    try:
        registry = Registry.attach(namespace)
    except gs.ControllerNotFound:
        return False
    try:
        return registry.controller().alive
    finally:
        registry.close()


def test_the_last_worker_to_leave_a_namespace_whose_controller_stopped_removes_it(
    namespace: str, tmp_path: Path
) -> None:
    def objects() -> list[str]:
        return sorted(n for n in os.listdir("/dev/shm") if namespace in n)

    controller = _serve(namespace, tmp_path)
    clients = []
    try:
        wait_until(lambda: _controller_alive(namespace) or controller.poll() is not None)
        clients = [gs.connect(namespace, background=False) for _ in range(3)]
        clients.pop().close()  # its controller lives: nothing is removed
        assert names.control(namespace)[1:] in objects()
        controller.send_signal(signal.SIGTERM)
        _, err = controller.communicate(timeout=WAIT)
        assert controller.returncode == 0, err
        kept = objects()  # control, lock, status, both rings: kept for the two workers
        ring = names.ring(namespace, clients[0].slot)
        assert {names.control(namespace)[1:], ring[1:]} < set(kept)
        clients.pop().close()  # another worker lives: nothing is removed
        assert objects() == kept
        clients.pop().close()
        assert not objects()
    finally:
        for client in clients:
            client.close()
        if controller.poll() is None:
            controller.kill()
            controller.communicate()
        cleanup(namespace)
