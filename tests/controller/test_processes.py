"""`gearshift serve` as a real process, with workers in this process and in child processes."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

import gearshift as gs
from gearshift.cli import main
from gearshift.clikit import EXIT_CONFLICT, EXIT_NOT_RUNNING, EXIT_OK
from gearshift.controller import statefile, status
from gearshift.controller.costbook import CostBook
from gearshift.core.config import PolicyConfig
from gearshift.errors import ControllerNotFound
from gearshift.shm import Registry, cleanup

from .workers import WAIT, Worker

FAST = [
    f"--set={kv}"
    for kv in (
        "check_interval_seconds=0.2",
        "update_interval_seconds=0.5",
        "recent_use_protect_seconds=0.5",
        "window_seconds=10",
        "half_life_seconds=5",
        "slice_seconds=0.5",
        "scan_interval_seconds=0.1",
        "status_interval_seconds=0.1",
        "save_interval_seconds=0.5",
    )
]


def wait_for(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def owner(namespace: str) -> int | None:
    """The pid of the namespace's live controller, if any."""
    try:
        registry = Registry.attach(namespace)
    except ControllerNotFound:
        return None
    try:
        info = registry.controller()
    finally:
        registry.close()
    return info.pid if info.alive else None


@pytest.fixture
def serve(namespace: str, tmp_path: Path) -> Iterator[Callable[[], subprocess.Popen]]:
    """Start `gearshift serve` for the namespace (short intervals); every one is ended."""
    started: list[subprocess.Popen] = []

    def start() -> subprocess.Popen:
        started.append(
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gearshift",
                    "serve",
                    "-n",
                    namespace,
                    "--state-dir",
                    str(tmp_path),
                    "--log-level",
                    "WARNING",
                    *FAST,
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
        wait_for(
            lambda: owner(namespace) == started[-1].pid or started[-1].poll() is not None,
            "the controller to start",
        )
        return started[-1]

    yield start
    for proc in started:
        proc.kill()
        proc.wait(WAIT)
        proc.stderr.close()
    cleanup(namespace)


def test_serve_survives_and_resumes(
    serve: Callable[[], subprocess.Popen], namespace: str, tmp_path: Path
) -> None:
    first = serve()
    second = serve()  # a live controller owns the namespace
    assert second.wait(WAIT) == EXIT_CONFLICT and f"pid {first.pid}" in second.stderr.read()

    worker = Worker(namespace)
    try:
        worker.register(0, "decode")
        wait_for(
            lambda: worker.put(0, 40) and 40 in worker.gears("decode")["B"],
            "a gear at the traffic's size",
        )

        dying = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("workers.py")), namespace, "0", "100"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert dying.stdout.readline().startswith("ready")
        dying.kill()
        dying.wait(WAIT)
        dying.stdout.close()
        wait_for(
            lambda: status.read(namespace)["events"]["reclaimed_workers"] == 1,
            "the dead worker's slot to be reclaimed",
        )

        wait_for(  # saved within save_interval_seconds of the change
            lambda: 40 in statefile.load(tmp_path, time.monotonic(), PolicyConfig())[0]
            .profiles["decode"].gear_lists()["B"],
            "the gear in the state file",
        )
        first.kill()  # SIGKILL: no final drain, no goodbye
        first.wait(WAIT)
        version = worker.snapshot()[0]
        puts = [worker.put(0, 40) for _ in range(2 * worker.ring.capacity)]  # never blocks
        assert not all(puts) and worker.ring.dropped > 0
        assert worker.snapshot()[0] == version and 40 in worker.gears("decode")["B"]
        assert CliRunner().invoke(main, ["status", "-n", namespace]).exit_code == (EXIT_NOT_RUNNING)

        third = serve()  # takes the dead controller's namespace over
        wait_for(lambda: worker.snapshot()[0] > version, "a version above the last one")
        [device] = status.read(namespace)["devices"]
        assert 40 in device["profiles"][0]["dims"][0]["gears"]  # from the state file

        result = CliRunner().invoke(main, ["stop", "-n", namespace])
        assert result.exit_code == EXIT_OK, result.output
        assert third.wait(WAIT) == EXIT_OK
        assert worker.snapshot()[0] >= version + 1  # the segments stay for the live worker
        saved = statefile.load(tmp_path, time.monotonic(), PolicyConfig())
        assert 40 in saved[0].profiles["decode"].gear_lists()["B"]
        refused = CliRunner().invoke(main, ["cleanup", "-n", namespace])
        assert refused.exit_code == EXIT_CONFLICT and "live worker" in refused.stderr
    finally:
        worker.close()


def test_measurements_reach_status_the_state_file_and_a_successor(
    serve: Callable[[], subprocess.Popen], namespace: str, tmp_path: Path
) -> None:
    """A real worker's graphs (the cpu backend) are measured, sent over its ring to `gearshift
    serve`, shown by `status`, saved at stop, and shown again by the next controller."""

    def costs() -> dict | None:
        doc = status.read(namespace)
        if doc is None or doc["pid"] != controller.pid:  # the last one's document, still there
            return None
        dims = [d for dev in doc["devices"] for p in dev["profiles"] for d in p["dims"]]
        return dims[0]["costs"] if dims else None

    controller = serve()
    with gs.connect(namespace) as client:
        prof = client.profile("prefill", {"SEQLEN": gs.Dim(gears=[8, 16, 32], max=64)},
                              lazy_start=False)  # every gear captured, so measured, at once
        prof.runner(torch.tanh, {"x": ("S", None)}, {"x": torch.zeros(1, 4)}, outputs=("S", None))
        wait_for(lambda: (c := costs()) is not None and c["measurements"] == 3, "3 measurements")
        c = costs()
        assert c["gears"] == [8, 16, 32] and c["counts"] == [1, 1, 1]
        assert c["replay_fit"] is not None and all(t > 0 for t in c["replay_seconds"])
        assert c["graph_bytes"]["b"] == pytest.approx(16.0)  # S x 4 floats out (not the input)
        assert c["graph_bytes"]["a"] == pytest.approx(0.0, abs=1e-6)
        text = CliRunner().invoke(main, ["status", "-n", namespace, "-v"])
        assert text.exit_code == EXIT_OK and "measured: 3 graphs" in text.output
        assert CliRunner().invoke(main, ["stop", "-n", namespace]).exit_code == EXIT_OK
        book = CostBook()
        statefile.load(tmp_path, time.monotonic(), PolicyConfig(), book)
        assert [m.gear for m in book.measurements(0, "prefill")["SEQLEN"]] == [32, 16, 8]
        controller = serve()  # takes over from the saved state: no graph is captured again
        wait_for(lambda: (c := costs()) is not None and c["measurements"] == 3, "restored")
