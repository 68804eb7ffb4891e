"""A state directory or state file someone else controls, and a final save that fails: refused or
said, never followed, waited on or silent (real `gearshift serve` processes where it matters)."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fakeclock import FakeClock

from gearshift.clikit import EXIT_ERROR, EXIT_OK
from gearshift.controller import metrics, statedir, statefile, status, view
from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller
from gearshift.core.config import PolicyConfig
from gearshift.errors import StateError, UnsafeStateDir
from gearshift.shm import cleanup

from .workers import DIMS, POLICY, WAIT, Worker

CONFIG = PolicyConfig()
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away needs root")


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    return victim


def test_a_symlinked_lock_file_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    state, victim = tmp_path / "state", _victim(tmp_path)
    state.mkdir(mode=0o700)
    (state / statefile.LOCK_FILE).symlink_to(victim)
    with pytest.raises(UnsafeStateDir, match=f"{state / statefile.LOCK_FILE} is a symlink"):
        statefile.StateLock.acquire(state)
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("make", ["world-writable", "group-writable", "symlink",
                                  pytest.param("other user",
                                               marks=root_only)])
def test_a_state_directory_others_control_is_refused_naming_it(tmp_path: Path, make: str) -> None:
    real, victim = tmp_path / "real", _victim(tmp_path)
    real.mkdir(mode=0o700)
    (real / statefile.LOCK_FILE).symlink_to(victim)
    state = real
    if make == "world-writable":
        real.chmod(0o777)
    elif make == "group-writable":
        real.chmod(0o770)
    elif make == "other user":
        os.chown(real, 65534, 65534)
    else:
        state = tmp_path / "link"
        state.symlink_to(real)
    with pytest.raises(UnsafeStateDir, match=str(state)):
        statefile.StateLock.acquire(state)
    with pytest.raises(UnsafeStateDir, match=str(state)):
        statefile.save(state, {})
    assert victim.read_text() == "precious\n" and not (real / statefile.STATE_FILE).exists()


@root_only
def test_a_state_file_of_another_user_is_refused(tmp_path: Path) -> None:
    statefile.save(tmp_path, {})
    os.chown(tmp_path / statefile.STATE_FILE, 65534, 65534)
    with pytest.raises(UnsafeStateDir, match=r"state file .* belongs to uid 65534"):
        statefile.restore(tmp_path, 0.0, CONFIG, fresh_on_corrupt=True)
    assert (tmp_path / statefile.STATE_FILE).exists()  # never set aside either


def test_a_symlinked_state_file_is_not_followed(tmp_path: Path) -> None:
    (tmp_path / statefile.STATE_FILE).symlink_to(_victim(tmp_path))
    with pytest.raises(StateError, match="is a symlink"):
        statefile.load(tmp_path, 0.0, CONFIG)


def test_an_oversized_state_file_is_refused_unread_and_set_aside_when_asked(
    tmp_path: Path,
) -> None:
    with open(tmp_path / statefile.STATE_FILE, "wb") as f:
        f.truncate(8 << 30)  # sparse: 8 GB that take no disk
    with pytest.raises(StateError, match=f"holds {8 << 30} bytes, over the"):
        statefile.load(tmp_path, 0.0, CONFIG)
    assert statefile.restore(tmp_path, 0.0, CONFIG, fresh_on_corrupt=True) == {}
    assert (tmp_path / (statefile.STATE_FILE + ".corrupt")).stat().st_size == 8 << 30


def test_a_save_never_writes_what_a_restart_would_refuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(statedir, "MAX_STATE_BYTES", 16)
    with pytest.raises(StateError, match="not saved"):
        statefile.save(tmp_path, {})
    assert list(tmp_path.iterdir()) == []


# -- real `gearshift serve` processes --


def _serve(namespace: str, state: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gearshift", "serve", "-n", namespace, "--state-dir", str(state),
         "--log-level", "WARNING", *args],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _wait_for(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _owns(namespace: str, proc: subprocess.Popen) -> bool:
    """Whether `proc` serves the namespace, opened (its state restored: a status published)."""
    doc = status.read(namespace)
    return doc is not None and doc["pid"] == proc.pid


@pytest.fixture
def processes(namespace: str) -> Iterator[list[subprocess.Popen]]:
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait(WAIT)
        proc.stderr.close()
    cleanup(namespace)


def _stop(namespace: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gearshift", "stop", "-n", namespace],
                          capture_output=True, text=True, timeout=60)


def test_a_fifo_for_a_state_file_is_refused_not_waited_on(
    namespace: str, tmp_path: Path, processes: list[subprocess.Popen]
) -> None:
    os.mkfifo(tmp_path / statefile.STATE_FILE)
    processes.append(refused := _serve(namespace, tmp_path))
    assert refused.wait(WAIT) == EXIT_ERROR  # before: blocked in open() for good
    assert "is not a regular file" in refused.stderr.read()
    processes.append(fresh := _serve(namespace, tmp_path, "--fresh-on-corrupt-state"))
    _wait_for(lambda: _owns(namespace, fresh) or fresh.poll() is not None, "a fresh start")
    assert fresh.poll() is None, fresh.stderr.read()
    assert _stop(namespace).returncode == EXIT_OK and fresh.wait(WAIT) == EXIT_OK
    assert (tmp_path / (statefile.STATE_FILE + ".corrupt")).is_fifo()
    assert (tmp_path / statefile.STATE_FILE).is_file()


def _break(state: Path) -> None:
    """The state directory gone, a file in its place: every save fails."""
    shutil.rmtree(state)
    state.write_text("not a directory")


def test_a_failed_final_save_fails_serve_and_stop(
    namespace: str, tmp_path: Path, processes: list[subprocess.Popen]
) -> None:
    state = tmp_path / "state"
    processes.append(proc := _serve(namespace, state))
    _wait_for(lambda: _owns(namespace, proc) or proc.poll() is not None, "the controller")
    _break(state)
    stopped = _stop(namespace)
    assert stopped.returncode == EXIT_ERROR  # before: 0, "stopped"
    assert "stopped, but its final state save failed" in stopped.stderr
    assert proc.wait(WAIT) == EXIT_ERROR  # before: 0
    assert "final state save" in proc.stderr.read()


def test_the_final_save_is_logged_even_right_after_another_failed_save(
    namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from fakeclock import FakeClock

    clock = FakeClock(1.0)
    config = ControllerConfig(namespace=namespace, state_dir=str(tmp_path / "state"))
    controller = Controller.open(config, CONFIG, clock=clock)
    _break(tmp_path / "state")
    w = Worker(namespace, 0, clock)
    with caplog.at_level(logging.ERROR):  # a new profile is saved on the loop: it fails, logged
        assert w.register(0, "decode", serve=controller.step)["op"] == "registered"
    w.close()
    assert controller.counts["errors"] == 1 and len(caplog.records) == 1
    assert "state save" in caplog.records[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.ERROR), pytest.raises(StateError, match="final state save"):
        controller.close()  # in the same 10 s: the loop's errors would be throttled
    assert any("final state save" in r.getMessage() for r in caplog.records)
    assert controller.status is not None and controller.status["final_save"].startswith("failed")


def test_a_registration_whose_save_failed_reaches_the_state_file_once_saves_work_again(
    controller: Controller, clock: FakeClock, worker: Callable[..., Worker],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failed on-loop save (a full state directory) was never retried: a crash lost the
    profiles registered meanwhile, and `status` said only "N loop errors"."""
    real = statefile.save

    def full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(statefile, "save", full)
    w = worker()
    w.register(0, "decode", DIMS, serve=controller.step)  # answered all the same
    since = controller.saver.unsaved_since
    assert since is not None
    doc = controller.status_document(clock.now())
    assert doc["unsaved_since"] == since
    text = view.render({"namespace": "ns", "controller": {"pid": 1, "alive": True,
                        "heartbeat_age_seconds": None}, "slots": [], "versions": {},
                        "status": doc})
    assert "STATE UNSAVED since" in text
    pytest.importorskip("prometheus_client")
    later = controller.status_document(since + 2.0)
    (gauge,) = [f for f in metrics._Collector(lambda: later).collect()
                if f.name == "gearshift_state_unsaved_seconds"]
    assert gauge.samples[0].value == pytest.approx(2.0)
    monkeypatch.setattr(statefile, "save", real)
    for _ in range(3):
        clock.advance(controller.config.save_interval_seconds)
        controller.step()
        controller.saver.wait()
    controller.step()
    assert controller.saver.unsaved_since is None
    restored = statefile.load(controller.config.state_path, clock.now(), POLICY)
    assert "decode" in restored[0].profiles
