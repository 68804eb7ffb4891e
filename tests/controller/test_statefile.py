"""The state file's life (`controller.statefile`): one controller process per directory (the
lock), a missing file a fresh start, an atomic save fsynced with its directory, a state over the
bound saved without its statistics; the `Saver`: saves written off the loop at a bounded rate,
failures reported and retried, a group round saved; `gearshift cleanup --state`: a namespace's
state removed on request, never a live one's. (The format, both ways: test_stateformat.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result
from fakeclock import FakeClock

from gearshift.cli import main
from gearshift.clikit import EXIT_CONFLICT, EXIT_ERROR, EXIT_OK
from gearshift.controller import statedir, statefile, stateformat
from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller
from gearshift.controller.costbook import CostBook
from gearshift.controller.grouprounds import GroupRounds
from gearshift.controller.groups import Groups, Member
from gearshift.controller.statefile import CORRUPT_FILE, remove_state
from gearshift.core.config import PolicyConfig
from gearshift.core.round import DeviceLedger
from gearshift.errors import StateError

from .test_stateformat import CONFIG, _book, _devices, _grouped
from .workers import WAIT

# -- the lock, a load and a save --


def test_a_state_over_the_file_bound_is_saved_without_its_statistics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Exact statistics of many profiles may outgrow MAX_STATE_BYTES: the gears, versions and
    costs are saved all the same, the statistics restart empty, with a warning."""
    devices = _devices(100.0)
    devices[0].profiles["decode"].stats["SEQLEN"].fold(np.full(4000, 99.0), np.arange(1, 4001))
    small = len(stateformat.encode(devices)) - 1
    monkeypatch.setattr(statedir, "MAX_STATE_BYTES", small)
    statefile.save(tmp_path, devices, _book())
    assert "saved without its statistics" in caplog.text
    assert (tmp_path / statefile.STATE_FILE).stat().st_size < small // 10  # no statistics
    book = CostBook()
    back = statefile.load(tmp_path, 100.0, CONFIG, book)
    profile = back[0].profiles["decode"]
    assert back[0].version == 7 and profile.gear_lists()["BATCHSIZE"] == [1, 8, 64]
    assert profile.stats["SEQLEN"].view(100.0).total_count == 0
    assert profile.history["SEQLEN"].view(100.0).total_count == 0
    assert book.measurements(0, "decode") == _book().measurements(0, "decode")


def test_missing_file_is_a_fresh_start(tmp_path: Path) -> None:
    assert statefile.load(tmp_path, 0.0, CONFIG) == {}


def test_one_controller_process_at_a_time_holds_a_state_directory(tmp_path: Path) -> None:
    (tmp_path / ".state-left-by-a-kill").write_bytes(b"partial")
    other = [sys.executable, "-c", "import sys, pathlib; from gearshift.controller import "
             "statefile; statefile.StateLock.acquire(pathlib.Path(sys.argv[1]))", str(tmp_path)]
    held = statefile.StateLock.acquire(tmp_path)
    try:
        assert not list(tmp_path.glob(".state-*"))  # stale temp files are removed
        refused = subprocess.run(other, capture_output=True, text=True, timeout=60)
        assert f"NamespaceBusy: state directory {tmp_path} is in use by another controller, " \
               f"pid {os.getpid()}" in refused.stderr
    finally:
        held.release()
    assert subprocess.run(other, timeout=60).returncode == 0  # free again


def test_a_save_syncs_the_directory_after_the_rename(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")),
                                                 real_fsync(fd)))
    statefile.save(tmp_path, _devices(100.0))
    assert synced[-1] == str(tmp_path)  # the directory, after the file itself
    assert synced[0].startswith(str(tmp_path / ".state-"))


# -- saves while the controller runs: the Saver --


def _saver(tmp_path: Path, clock: FakeClock, failures: list[Exception]) -> statefile.Saver:
    devices = {0: DeviceLedger(version=3)}
    return statefile.Saver(tmp_path, devices, CostBook(), 5.0, clock, failures.append)


def test_a_write_runs_off_the_loop_and_saves_are_bounded_in_rate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release, writes = threading.Event(), []
    real = statefile.write

    def blocked(directory: Path, tree: dict) -> Path:
        writes.append(tree["devices"][0]["version"])
        assert release.wait(WAIT)
        return real(directory, tree)

    monkeypatch.setattr(statefile, "write", blocked)
    clock, failures = FakeClock(100.0), []
    saver = _saver(tmp_path, clock, failures)
    saver.poll(100.0)
    assert writes == []  # nothing changed: nothing written
    saver.request()
    saver.poll(100.0)  # returns while its write waits in the writer thread
    saver.devices[0].version = 4
    saver.request()
    for now in (101.0, 106.0, 110.0):
        saver.poll(now)  # one write at a time
    release.set()
    saver.wait()
    assert saver.saves == 1 and writes == [3]  # the snapshot of the first poll
    saver.poll(104.9)  # within the interval of the last save's start
    saver.wait()
    assert writes == [3]
    saver.poll(105.0)
    saver.close()
    assert writes == [3, 4] and saver.saves == 2 and not failures
    assert statefile.load(tmp_path, 105.0, PolicyConfig())[0].version == 4


def test_a_failed_write_is_reported_at_the_next_poll_and_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(directory: Path, tree: dict) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(statefile, "write", full)
    clock, failures = FakeClock(0.0), []
    saver = _saver(tmp_path, clock, failures)
    saver.request()
    saver.poll(0.0)
    saver.wait()
    assert [type(e) for e in failures] == [OSError] and saver.changed
    monkeypatch.setattr(statefile, "write", lambda directory, tree: tmp_path)
    saver.poll(4.0)
    saver.wait()
    assert saver.changed and saver.saves == 0
    saver.poll(5.0)
    saver.close()
    assert not saver.changed and saver.saves == 1 and len(failures) == 1


def test_a_failed_save_on_the_loop_is_retried_off_it_and_unsaved_until_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = statefile.save

    def full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(statefile, "save", full)
    clock, failures = FakeClock(10.0), []
    saver = _saver(tmp_path, clock, failures)
    with pytest.raises(OSError):
        saver.save_now()  # a new profile's save, before its reply
    assert saver.changed and saver.unsaved_since == 10.0
    monkeypatch.setattr(statefile, "save", real)
    clock.advance(5.0)
    saver.poll(clock.now())  # off the loop, once the interval is over
    saver.wait()
    saver.poll(clock.now())
    assert saver.saves == 1 and not saver.changed and saver.unsaved_since is None
    assert (tmp_path / statefile.STATE_FILE).exists()


def test_a_group_round_or_a_change_of_members_is_saved_within_the_interval(
    tmp_path: Path,
) -> None:
    """The group rounds ask for no save themselves: the saver sees them (a kill after a group
    round would otherwise restore the gears before it, and the ranks would recapture)."""
    clock, failures = FakeClock(0.0), []
    devices, rounds = _grouped(0.0)
    saver = statefile.Saver(tmp_path, devices, CostBook(), 5.0, clock, failures.append, rounds)
    saver.save_now()
    key = ("tp", "trace")

    def saved() -> GroupRounds:
        back = GroupRounds(Groups(lambda slot, pid: True), {}, CONFIG, *[lambda *a: None] * 4)
        statefile.load(tmp_path, clock.now(), CONFIG, groups=back)
        return back

    saver.poll(5.0)
    assert not saver.changed  # nothing changed: nothing to save
    rounds.rounds += 1  # a group round
    rounds.last_update[key] = 5.0
    saver.poll(5.0)
    saver.wait()
    assert saved().last_update[key] == 5.0 and saver.saves == 1
    rounds.groups.profiles[key].ranks[1] = Member(7, 77, 1)  # rank 1's process replaced
    saver.poll(9.0)
    assert saver.changed  # saved at the end of the interval
    saver.poll(10.0)
    saver.close()
    assert saved().groups.profiles[key].ranks[1] == Member(7, 77, 1) and not failures


# -- removal: gearshift cleanup --state --


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
