"""`gearshift stress`: its JSON figures and exit status; an interrupted run ends every process
and segment it started."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from gearshift.cli import main
from gearshift.controller import status
from gearshift.tools.stress import KEYS

from .procs import processes_naming, shm_entries

WAIT = 60.0


def default_sigint() -> None:
    """In the child before exec: SIGINT's default disposition, even when the suite was started
    with it ignored (`nohup ... &`), which children inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_json_prints_exactly_the_figures_and_the_status_follows_the_invariants(
    namespace: str,
) -> None:
    result = CliRunner().invoke(
        main, ["stress", "--workers", "1", "--seconds", "1", "-n", namespace, "--json"]
    )
    figures = json.loads(result.stdout)
    assert list(figures) == list(KEYS)
    assert result.stderr.splitlines()[-1].startswith(("PASS (checked:", "FAIL: "))
    assert (figures["workers"], figures["seconds"], figures["worker_kills"]) == (1, 1.0, 0)
    assert figures["events_sent"] > 0
    # the invariants that no load can excuse hold; the stall bound is a timing, which a
    # loaded machine can break, so only the exit status is checked against it
    for key in ("events_lost", "torn_snapshots_accepted", "leaked_segments"):
        assert figures[key] == 0, (key, result.output)
    assert result.exit_code == int(figures["route_stall_ms_max"] > 1.0), result.output


def test_the_table_explains_dropped_against_lost_and_ends_with_the_verdict(
    namespace: str,
) -> None:
    args = ["stress", "--workers", "1", "--seconds", "1", "-n", namespace]
    result = CliRunner().invoke(main, args)
    lines = result.stdout.splitlines()
    assert any(line.startswith("events_dropped:") and "must be 0" in line for line in lines)
    assert lines[-1].startswith("PASS (checked:" if result.exit_code == 0 else "FAIL: ")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_run_leaves_nothing_behind(namespace: str, sig: int) -> None:
    command = [sys.executable, "-m", "gearshift", "stress", "--chaos", "-n", namespace]
    harness = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=default_sigint,
    )
    try:
        deadline = time.monotonic() + WAIT
        while (doc := status.read(namespace)) is None or len(doc["workers"]) < 4:
            assert harness.poll() is None and time.monotonic() < deadline, "it did not start"
            time.sleep(0.1)
        harness.send_signal(sig)
        assert harness.wait(WAIT) != 0
    finally:
        harness.kill()
        harness.wait()
    assert not shm_entries(namespace) and not processes_naming(namespace)
