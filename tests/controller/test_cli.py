"""The controller's commands through click's CliRunner (in-process controllers in virtual time)."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest
from fakeclock import FakeClock

from gearshift.clikit import EXIT_CONFLICT, EXIT_ERROR, EXIT_NOT_RUNNING, EXIT_OK, EXIT_USAGE
from gearshift.controller import statefile
from gearshift.controller.config import ControllerConfig, load_initial_gears
from gearshift.controller.controller import Controller
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim
from gearshift.shm import SnapshotRegion

from .clirun import gs
from .workers import WAIT, Worker

COMMANDS = ["serve", "status", "snapshot", "stop", "cleanup", "export"]


@pytest.fixture
def live(namespace: str, tmp_path: Path) -> Iterator[tuple[Controller, Worker]]:
    """An in-process controller with one registered worker, its status published."""
    config = ControllerConfig(namespace=namespace, state_dir=str(tmp_path))
    controller = Controller.open(config, PolicyConfig(), clock=FakeClock(1.0))
    worker = Worker(namespace, 0, controller.clock)
    worker.register(0, "decode", serve=controller.step)
    controller.step()
    yield controller, worker
    worker.close()
    controller.close()


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_explains_itself(command: str) -> None:
    result = gs(command, "--help")
    assert result.exit_code == EXIT_OK
    assert "Exit status" in result.output and "GEARSHIFT_NAMESPACE" in result.output


def test_the_commands_never_import_torch() -> None:
    code = (
        "import sys, gearshift.controller.cli, gearshift.controller.metrics; "
        "from gearshift.cli import main; "
        "[main.get_command(None, c) for c in ('serve', 'status', 'stop', 'export')]; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


@pytest.mark.parametrize(
    "toml, args, code, message",
    [
        ("[policy\n", [], EXIT_USAGE, "not valid TOML"),
        ("[controller]\nslotz = 1\n", [], EXIT_USAGE, "slotz: unknown key"),
        ("", ["--set", "nope=1"], EXIT_USAGE, "nope: unknown key"),
        ("", ["--set", "window_seconds=-1"], EXIT_USAGE, "window_seconds"),
        ("", ["--namespace", "a/b"], EXIT_USAGE, "invalid namespace"),
        ("", ["--initial-gears", "missing.json"], EXIT_USAGE, "initial_gears"),
    ],
)
def test_serve_refuses_bad_configuration(
    tmp_path: Path, namespace: str, toml: str, args: list[str], code: int, message: str
) -> None:
    (tmp_path / "gs.toml").write_text(toml)
    result = gs(
        "serve",
        "-n",
        namespace,
        "--config",
        str(tmp_path / "gs.toml"),
        "--state-dir",
        str(tmp_path),
        *args,
    )
    assert result.exit_code == code and message in result.stderr


def test_serve_refuses_a_corrupt_state_file(tmp_path: Path, namespace: str) -> None:
    (tmp_path / statefile.STATE_FILE).write_bytes(b"\xc1garbage")
    result = gs("serve", "--state-dir", str(tmp_path), env={"GEARSHIFT_NAMESPACE": namespace})
    assert result.exit_code == EXIT_ERROR
    assert "corrupt state" in result.stderr and "--fresh-on-corrupt-state" not in result.stderr


def test_metrics_without_prometheus_client_is_a_clear_error(
    tmp_path: Path, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    result = gs("serve", "-n", namespace, "--state-dir", str(tmp_path), "--metrics-port", "0")
    assert result.exit_code == EXIT_USAGE and "gearshift[metrics]" in result.stderr


@pytest.mark.parametrize("command", ["status", "snapshot", "export", "stop"])
def test_an_absent_namespace_means_not_running(namespace: str, command: str) -> None:
    result = gs(command, "-n", namespace)
    assert result.exit_code == EXIT_NOT_RUNNING and namespace in result.stderr
    if command == "status":
        assert f"gearshift serve -n {namespace}" in result.stderr  # how to start one
    if command in ("snapshot", "export"):  # say when there will be one
        assert "published when a worker registers a profile" in result.stderr
    if command == "stop":  # nothing to stop: no advice to start one
        assert result.stderr == f"error: no controller is running on namespace {namespace!r}\n"


def test_a_metrics_port_in_use_is_named_before_anything_is_created(
    tmp_path: Path, namespace: str
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        state = tmp_path / "state"
        result = gs("serve", "-n", namespace, "--state-dir", str(state), f"--metrics-port={port}")
    assert result.exit_code == EXIT_USAGE and f"127.0.0.1:{port}" in result.stderr
    assert not state.exists() and not [n for n in os.listdir("/dev/shm") if namespace in n]


def test_cleanup_of_an_absent_namespace_removes_nothing(namespace: str) -> None:
    result = gs("cleanup", "-n", namespace)
    assert result.exit_code == EXIT_OK and "nothing to remove" in result.output


def test_status_shows_controller_workers_and_gears(live: tuple[Controller, Worker]) -> None:
    controller, worker = live
    ns = controller.config.namespace
    view = json.loads(gs("status", "-n", ns, "--json").output)
    assert view["controller"]["alive"] and view["status"]["devices"][0]["version"] == 1
    assert [s["slot"] for s in view["slots"]] == [worker.slot]
    text = gs("status", "-n", ns)
    assert text.exit_code == EXIT_OK
    assert "running" in text.output and "decode/B" in text.output and "hit" not in text.output
    assert "    gears 1 2 4 8 16 32 64" in text.output
    assert "    hit  " in gs("status", "-n", ns, "-v").output  # the per-gear rates
    assert "samples in the window, 0 in the history" in text.output  # no events yet


def test_status_json_shows_no_slot_ahead_of_its_devices_version(
    live: tuple[Controller, Worker],
) -> None:
    controller, worker = live
    ns = controller.config.namespace
    region = SnapshotRegion.attach(ns, 0)
    try:  # a snapshot newer than the last status document, which the worker has applied
        newer = region.publish({"profiles": {}}, at_least=region.version() + 1)
    finally:
        region.close()
    assert worker.snapshot()[0] == newer  # acked in the slot
    view = json.loads(gs("status", "-n", ns, "--json").output)
    [slot] = view["slots"]
    assert slot["applied_version"] == newer <= view["versions"]["0"]
    assert view["status"]["devices"][0]["version"] < newer  # the document is older: see --help
    assert f"device 0: version {newer}," in gs("status", "-n", ns).output


def test_status_shows_a_priced_dims_cost(live: tuple[Controller, Worker]) -> None:
    controller, worker = live
    priced = {"S": Dim(max=4096, cost=(2e-4, 2.35e-6, 1.15e-9))}
    worker.register(1, "prefill", priced, serve=controller.step)
    controller.clock.advance(2.0)  # the next status document
    controller.step()
    lines = gs("status", "-n", controller.config.namespace).output.splitlines()
    [decode] = [line for line in lines if "decode/B: padding" in line]
    [prefill] = [line for line in lines if "prefill/S: padding" in line]
    assert "cost" not in lines[lines.index(decode) + 1]  # elements, the default: not shown
    assert lines[lines.index(prefill) + 1] == (
        "    cost of a chunk of size x: 0.0002 + 2.35e-06 x + 1.15e-09 x^2")


def test_snapshot_and_export_print_the_gears_in_use(
    live: tuple[Controller, Worker], tmp_path: Path
) -> None:
    ns = live[0].config.namespace
    [snap] = json.loads(gs("snapshot", "-n", ns, "--json", "--device", "0").output)
    assert snap["version"] == 1 and snap["profiles"]["decode"]["gears"]["B"][-1] == 64
    assert "decode/B: 1 2 4 8 16 32 64" in gs("snapshot", "-n", ns).output
    assert gs("snapshot", "-n", ns, "--device", "3").exit_code == EXIT_NOT_RUNNING
    (tmp_path / "gears.json").write_text(gs("export", "-n", ns).output)
    assert load_initial_gears(tmp_path / "gears.json") == {
        0: {"decode": {"B": (1, 2, 4, 8, 16, 32, 64)}}
    }


@pytest.mark.parametrize("fmt", ["json", "vllm", "sglang", "trtllm", "torchair"])
def test_export_writes_each_engines_form_and_serve_reads_it_back(
    live: tuple[Controller, Worker], tmp_path: Path, fmt: str
) -> None:
    ns = live[0].config.namespace
    extra = {"json": [], "torchair": ["--fit", "--axis", "B=0"]}.get(fmt, ["--dim", "B"])
    result = gs("export", "-n", ns, "--format", fmt, *extra)  # B: BATCHSIZE's name
    assert result.exit_code == EXIT_OK, result.output
    (tmp_path / "gears.txt").write_text(result.stdout)
    gears = (1, 2, 4, 8, 16, 32, 64) if fmt != "torchair" else (2, 4, 8, 16, 32, 64)
    assert load_initial_gears(tmp_path / "gears.txt") == {0: {"decode": {"B": gears}}}
    assert load_initial_gears(tmp_path / "gears.txt", fmt) == {0: {"decode": {"B": gears}}}


def test_export_refuses_what_an_engine_cannot_take_and_notes_what_it_leaves_out(
    live: tuple[Controller, Worker],
) -> None:
    ns = live[0].config.namespace
    refused = gs("export", "-n", ns, "--format", "torchair")
    assert refused.exit_code == EXIT_USAGE and "takes no gear below 2" in refused.stderr
    guess = gs("export", "-n", ns, "--format", "torchair", "--fit")
    assert guess.exit_code == EXIT_USAGE and not guess.stdout
    assert "the axis of decode/B is not known" in guess.stderr and "--axis B=1" in guess.stderr
    given = gs("export", "-n", ns, "--format", "torchair", "--fit", "--axis", "B=1")
    assert given.exit_code == EXIT_OK and "DIM_GEARS = {1: [2, 4, 8, 16, 32, 64]}" in given.stdout
    assert "note: torchair: decode/B on tensor axis 1 (from --axis)" in given.stderr
    absent = gs("export", "-n", ns, "--format", "vllm")
    assert absent.exit_code == EXIT_USAGE and "has no BATCHSIZE (dims: B)" in absent.stderr
    controller, worker = live
    worker.register(1, "batched", {"B": Dim(max=64), "S": Dim(max=512)}, serve=controller.step)
    controller.step()
    out = gs("export", "-n", ns, "--format", "trtllm", "--profile", "batched", "--dim", "B")
    assert out.exit_code == EXIT_OK and "batch_sizes: [1, 2, 4, 8, 16, 32, 64]" in out.stdout
    assert "note: TensorRT-LLM takes one dim here: batched/S left out" in out.stderr


def test_serve_refuses_initial_gears_of_another_format(tmp_path: Path, namespace: str) -> None:
    (tmp_path / "gears.json").write_text('{"devices": {"0": {"decode": {"B": [1, 8]}}}}')
    result = gs("serve", "-n", namespace, "--state-dir", str(tmp_path), "--initial-gears",
                str(tmp_path / "gears.json"), "--initial-gears-format", "sglang")
    assert result.exit_code == EXIT_USAGE
    assert "initial_gears: " in result.stderr and "not sglang gears" in result.stderr


def test_cleanup_is_refused_while_the_controller_lives(live: tuple[Controller, Worker]) -> None:
    result = gs("cleanup", "-n", live[0].config.namespace)
    assert result.exit_code == EXIT_CONFLICT and "live controller" in result.stderr


def test_stop_refuses_an_embedded_controller(namespace: str, tmp_path: Path) -> None:
    config = ControllerConfig(namespace=namespace, state_dir=str(tmp_path))
    with Controller.open(config, clock=FakeClock(), embedded=True) as controller:
        controller.step()  # its status says embedded: signalling it would stop this worker
        result = gs("stop", "-n", namespace)
    assert result.exit_code == EXIT_CONFLICT and "embedded in worker pid" in result.stderr


def test_serve_refuses_a_state_directory_another_controller_holds_in_one_line(
    namespace: str, tmp_path: Path
) -> None:
    held = statefile.StateLock.acquire(tmp_path)  # as a controller of another namespace would
    try:
        serve = subprocess.run(
            [sys.executable, "-m", "gearshift", "serve", "-n", namespace, "--state-dir",
             str(tmp_path)], capture_output=True, text=True, timeout=60,
        )
    finally:
        held.release()
    assert serve.returncode == EXIT_CONFLICT  # it ran as another process: the lock holds
    (line,) = serve.stderr.strip().splitlines()
    assert line == (f"error: state directory {tmp_path} is in use by another controller, "
                    f"pid {os.getpid()}")


def test_serve_names_a_misspelled_table_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "gs.toml"
    config.write_text("[controler]\nslots = 8\n")
    result = gs("serve", "--config", str(config), "--state-dir", str(tmp_path))
    assert result.exit_code == EXIT_USAGE
    assert result.output.strip().splitlines() == [
        f"error: controler: unknown table [controler] in {config} (known: [policy], [controller])"
    ]


def test_status_watch_keeps_watching_across_a_stop_and_a_restart(
    namespace: str, tmp_path: Path
) -> None:
    """Absent, running, stopped with a worker left (its last pid shown), running again: one
    `status --watch` process sees it all, and Ctrl-C ends it (0: the last view was running)."""
    watcher = subprocess.Popen(
        [sys.executable, "-m", "gearshift", "status", "--watch", "-n", namespace],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    seen: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [seen.put(line) for line in watcher.stdout], daemon=True
                     ).start()

    def shows(text: str) -> None:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            with suppress(queue.Empty):
                if text in seen.get(timeout=0.5):
                    return
            assert watcher.poll() is None, watcher.stderr.read()
        raise AssertionError(f"status --watch never showed {text!r}")

    config = ControllerConfig(namespace=namespace, state_dir=str(tmp_path))
    opened: list[Controller | Worker] = []  # closed last first, whatever happens
    try:
        shows(f"namespace {namespace!r}: no controller running")
        first = Controller.open(config, PolicyConfig(), clock=FakeClock(1.0))
        opened.append(first)
        worker = Worker(namespace, 0, first.clock)
        opened.append(worker)
        worker.register(0, "decode", serve=first.step)
        shows(f"controller pid {os.getpid()} running")
        first.close()  # the worker keeps the namespace
        shows(f"controller NOT RUNNING (last pid {os.getpid()})")
        opened.append(Controller.open(config, PolicyConfig(), clock=FakeClock(2.0)))
        shows(f"controller pid {os.getpid()} running")
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(WAIT) == EXIT_OK
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait(WAIT)
        for done in sorted(opened, key=lambda o: isinstance(o, Controller)):  # workers first
            done.close()  # (a controller's close is idempotent)
