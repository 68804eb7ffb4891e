"""Saver: the state file saved at a bounded rate, written off the loop; failures reported and
retried."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from fakeclock import FakeClock

from gearshift.controller import saving, statefile
from gearshift.controller.costbook import CostBook
from gearshift.core.config import PolicyConfig
from gearshift.core.round import DeviceLedger

from .workers import WAIT


def _saver(tmp_path: Path, clock: FakeClock, failures: list[Exception]) -> saving.Saver:
    devices = {0: DeviceLedger(version=3)}
    return saving.Saver(tmp_path, devices, CostBook(), 5.0, clock, failures.append)


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
