"""`gearshift cleanup --state`: a namespace's state removed on request, never a live one's."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from fakeclock import FakeClock

from gearshift.cli import main
from gearshift.clikit import EXIT_CONFLICT, EXIT_ERROR, EXIT_OK
from gearshift.controller import statefile
from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller
from gearshift.controller.stateclear import CORRUPT_FILE, remove_state
from gearshift.errors import StateError

from .workers import WAIT


def gs(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def _stopped(namespace: str, state_dir: Path | None = None) -> Path:
    """The state directory a controller of `namespace` left (default: the user's default)."""
    config = ControllerConfig(namespace=namespace, state_dir=str(state_dir or ""))
    Controller.open(config, clock=FakeClock()).close()
    assert (config.state_path / statefile.STATE_FILE).exists()
    return config.state_path


def test_cleanup_keeps_the_state_and_says_where_and_cleanup_state_removes_it(
    namespace: str, private_state_home: Path
) -> None:
    state = _stopped(namespace)
    assert state.parent == private_state_home / "gearshift"  # the default directory
    kept = gs("cleanup", "-n", namespace)
    assert kept.exit_code == EXIT_OK
    assert f"its state stays in {state} (--state removes it)" in kept.stdout
    assert (state / statefile.STATE_FILE).exists()
    removed = gs("cleanup", "-n", namespace, "--state")
    assert removed.exit_code == EXIT_OK
    assert removed.stdout.split() == [str(state / statefile.STATE_FILE),
                                      str(state / statefile.LOCK_FILE), str(state)]
    assert not state.exists()
    again = gs("cleanup", "-n", namespace, "--state")
    assert again.exit_code == EXIT_OK and "nothing to remove" in again.stdout


def test_a_given_state_directory_keeps_itself_and_files_not_gearshifts(
    namespace: str, tmp_path: Path
) -> None:
    state = _stopped(namespace, tmp_path)
    (state / CORRUPT_FILE).write_bytes(b"x")
    (state / "notes.txt").write_text("mine")
    removed = remove_state(state)
    assert sorted(p.name for p in removed) == sorted(
        [statefile.STATE_FILE, CORRUPT_FILE, statefile.LOCK_FILE])
    assert [p.name for p in state.iterdir()] == ["notes.txt"]


def test_cleanup_state_is_refused_while_a_controller_holds_the_directory(
    namespace: str, tmp_path: Path
) -> None:
    state = _stopped(namespace, tmp_path)
    serve = subprocess.Popen(  # another namespace's controller on the same state directory
        [sys.executable, "-m", "gearshift", "serve", "-n", f"{namespace}b", "--state-dir",
         str(state)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + WAIT
        while (state / statefile.LOCK_FILE).read_text().strip() != str(serve.pid):
            assert time.monotonic() < deadline and serve.poll() is None, "serve did not start"
            time.sleep(0.02)
        refused = gs("cleanup", "-n", namespace, "--state", "--state-dir", str(state))
    finally:
        serve.terminate()
        serve.communicate(timeout=WAIT)
    assert refused.exit_code == EXIT_CONFLICT
    assert f"in use by another controller, pid {serve.pid}" in refused.stderr
    assert (state / statefile.STATE_FILE).exists()


def test_a_symlinked_state_directory_is_refused(namespace: str, tmp_path: Path) -> None:
    state = _stopped(namespace, tmp_path / "real")
    link = tmp_path / "link"
    link.symlink_to(state)
    with pytest.raises(StateError, match="is a symlink"):
        remove_state(link)
    result = gs("cleanup", "-n", namespace, "--state", "--state-dir", str(link))
    assert result.exit_code == EXIT_ERROR and "nothing removed" in result.stderr
    assert (state / statefile.STATE_FILE).exists() and os.path.islink(link)
