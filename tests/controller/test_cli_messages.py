"""What the controller's commands say: serve's keys and their precedence, serve's lines in
order, `stop` with no controller, `export` of gears a stopped controller left."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakeclock import FakeClock

from gearshift.clikit import EXIT_CONFLICT, EXIT_NOT_RUNNING, EXIT_OK, EXIT_USAGE
from gearshift.controller import statefile
from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller
from gearshift.core.config import PolicyConfig
from gearshift.errors import ControllerNotFound, ControllerRunning
from gearshift.shm import Registry, cleanup

from .clirun import gs
from .workers import WAIT, Worker


@pytest.mark.parametrize(
    "args, env, expected",
    [
        (["--set", "namespace=fromset"], {"GEARSHIFT_NAMESPACE": "fromenv"}, "fromset"),
        (["-n", "fromflag"], {"GEARSHIFT_NAMESPACE": "fromenv"}, "fromflag"),
        ([], {"GEARSHIFT_NAMESPACE": "fromenv"}, "fromenv"),
        ([], {}, "fromfile"),
        (["-n", "fromflag", "--set", "namespace=fromset"], {}, None),  # refused: they disagree
    ],
)
def test_serve_takes_a_key_from_its_flag_then_set_then_the_variable_then_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], env: dict[str, str],
    expected: str | None,
) -> None:
    opened = []

    def open_(config: ControllerConfig, *_: object, **__: object) -> None:
        opened.append(config.namespace)
        raise ControllerRunning(config.namespace, 1)  # stops serve there

    monkeypatch.setattr(Controller, "open", open_)
    (tmp_path / "gs.toml").write_text("[controller]\nnamespace = 'fromfile'\n")
    monkeypatch.delenv("GEARSHIFT_NAMESPACE", raising=False)
    result = gs("serve", "--config", str(tmp_path / "gs.toml"), *args, env=env)
    if expected is None:
        assert result.exit_code == EXIT_USAGE and not opened
        assert "--namespace fromflag and --set namespace=fromset disagree" in result.stderr
    else:
        assert result.exit_code == EXIT_CONFLICT and opened == [expected]


def _owned(namespace: str, pid: int) -> bool:
    try:
        registry = Registry.attach(namespace)
    except ControllerNotFound:
        return False
    try:
        return registry.controller().pid == pid
    finally:
        registry.close()


def test_serve_says_in_order_what_it_owns_restores_seeds_serves_and_saves(
    namespace: str, tmp_path: Path
) -> None:
    config = ControllerConfig(namespace=namespace, state_dir=str(tmp_path))
    with Controller.open(config, PolicyConfig(), clock=FakeClock(1.0)) as controller:
        first = Worker(namespace, 0, controller.clock)  # a state file that knows 'decode'
        first.register(0, "decode", serve=controller.step)
        first.close()
    seed = tmp_path / "gears.json"
    seed.write_text(json.dumps({"devices": {"0": {"decode": {"B": [4, 64]},
                                                  "prefill": {"S": [8, 512]}}}}))
    metrics = ["--metrics-port", "0"] if _has_prometheus() else []
    serve = subprocess.Popen(
        [sys.executable, "-m", "gearshift", "serve", "-n", namespace, "--state-dir",
         str(tmp_path), "--initial-gears", str(seed), *metrics],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    worker = None
    try:
        deadline = time.monotonic() + WAIT
        while not _owned(namespace, serve.pid):
            assert time.monotonic() < deadline and serve.poll() is None, "serve did not start"
            time.sleep(0.02)
        worker = Worker(namespace)  # alive at the stop: the namespace stays for it
        serve.send_signal(signal.SIGTERM)
        _, err = serve.communicate(timeout=WAIT)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.communicate()
        if worker is not None:
            worker.close()
        cleanup(namespace)
    assert serve.returncode == EXIT_OK
    said = [line.split(": ", 1)[1] for line in err.strip().splitlines()]
    state = tmp_path / statefile.STATE_FILE
    expected = [
        f"controller pid {serve.pid} owns namespace {namespace!r} (state file {state})",
        "device 0: snapshot version 2 published",
        *(["metrics served at http://127.0.0.1:"] if metrics else []),
        f"initial gears from {seed}: device 0 profile 'decode': B 4 64 (not used: the state "
        "file has this profile's gears)",
        f"initial gears from {seed}: device 0 profile 'prefill': S 8 512 (its gears until the "
        "first decision, once a worker registers it)",
        f"namespace {namespace!r} has a live worker, pid {os.getpid()} (slot 0): the namespace "
        "stays for it; the last worker to leave removes it",
        f"controller pid {serve.pid} stopped, state saved to {state}",
    ]
    assert len(said) == len(expected), said
    assert all(line.startswith(e) for line, e in zip(said, expected, strict=True)), said


def _has_prometheus() -> bool:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return False
    return True


def test_stop_of_a_stopped_controllers_namespace_just_says_none_runs(
    namespace: str, tmp_path: Path
) -> None:
    config = ControllerConfig(namespace=namespace, state_dir=str(tmp_path))
    with Controller.open(config, PolicyConfig(), clock=FakeClock(1.0)) as controller:
        worker = Worker(namespace, 0, controller.clock)  # keeps the namespace past the close
    try:
        result = gs("stop", "-n", namespace)
    finally:
        worker.close()
        cleanup(namespace)
    assert result.exit_code == EXIT_NOT_RUNNING
    assert result.stderr == f"error: no controller is running on namespace {namespace!r}\n"


def test_export_of_gears_a_stopped_controller_left_gives_their_age(
    namespace: str, tmp_path: Path
) -> None:
    config = ControllerConfig(namespace=namespace, state_dir=str(tmp_path))
    controller = Controller.open(config, PolicyConfig())  # the host's clock: ages are real
    worker = Worker(namespace, 0, controller.clock)
    try:
        worker.register(0, "decode", serve=controller.step)
        controller.step()
        running = gs("export", "-n", namespace)
        assert running.exit_code == EXIT_OK and "no controller" not in running.stderr
        controller.close()  # the namespace and its snapshot stay for the worker
        stale = gs("export", "-n", namespace)
    finally:
        controller.close()
        worker.close()
        cleanup(namespace)
    assert stale.exit_code == EXIT_OK and stale.stdout == running.stdout
    assert re.fullmatch(
        f"note: no controller is running on namespace {namespace!r}: these are the gears it "
        r"left \d+ s ago, and may be stale\n", stale.stderr
    )
