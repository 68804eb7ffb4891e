"""What the harness reads from the processes' logs."""

from __future__ import annotations

from pathlib import Path

from gearshift.tools.stress.roles import WorkerLog, reader_counts


def test_a_worker_log_keeps_the_stalls_logged_after_its_last_count(tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    log.write_text("ready 7\nv 3 100\nn 9000 400 1\ns 2000 150\nv 4 160\nn 9000 2000 3\ns 6000")
    read = WorkerLog.read(log)  # killed while writing its last line: it is partial, and skipped
    assert read.slot == 7 and read.versions == [(3, 100), (4, 160)] and read.interrupted == 3
    assert read.stalls == [(2000, 150)] and (read.wall_max, read.stall_max) == (9000, 2000)
    log.write_text("ready 7\nn 900 400 0\ns 2000 150\n")  # killed before its next count
    assert (WorkerLog.read(log).wall_max, WorkerLog.read(log).stall_max) == (2000, 2000)


def test_reader_counts_are_its_last_line(tmp_path: Path) -> None:
    log = tmp_path / "reader.log"
    log.write_text("")
    assert reader_counts(log) == (0, 0, 0, 0)
    log.write_text("a 10 2 0 0\nt 1 5 not_published\na 30 4 1 1\n")
    assert reader_counts(log) == (30, 4, 1, 1)
