"""A worker forked after `connect()` (a pre-fork server's, `faults.forked`): the child takes a
slot and a ring of its own, and its exit leaves the parent's slot, ring and embedded
controller's state directory alone."""

from __future__ import annotations

import gc
import os

from forked import reap

from gearshift.tools.stress import faults
from gearshift.worker import forking


def test_a_forked_child_records_through_its_own_slot_and_leaves_the_parents_alone() -> None:
    found = faults.forked()
    assert found["exit"] == 0 and found["child_exit"] == 0, found["log"]
    child = found["child"]
    assert child["registered"] and child["slot"] != found["parent_slot"]
    assert child["unrecorded"] == 1  # its first request, which started its swap thread
    assert found["claimed_after_idle_child"] == 1  # one that never records claims nothing
    assert found["slot_intact"], (found["row_before"], found["row_after"])  # before: False
    assert found["state_dir_kept"]  # before: False
    total = faults.BEFORE + faults.CHILD + faults.AFTER + found["routed_by_parent_meanwhile"]
    assert found["all_consumed"] and found["consumed"] == found["recorded"] == total
    assert found["unknown"] == found["dropped"] == 0  # before: the child's 5,001 lost
    assert found["state_dir_removed_at_close"]


class _Failing:
    """A client whose detaching fails in the child, after saying so on `fd`."""

    def __init__(self, fd: int, tag: int) -> None:
        self.fd, self.tag = fd, tag

    def _forked(self) -> None:
        os.write(self.fd, bytes([self.tag]))
        raise RuntimeError("detach failed")


def test_one_clients_failing_fork_hook_does_not_stop_the_others() -> None:
    read, write = os.pipe()
    clients = [_Failing(write, i) for i in range(8)]
    for c in clients:
        forking.track(c)
    try:
        pid = os.fork()
        if pid == 0:  # the child: every hook has run by now
            os._exit(0)
        os.close(write)
        status = reap(pid, 30.0)  # bounds a child that hangs
        with os.fdopen(read, "rb") as f:
            detached = f.read()
    finally:
        del clients, c
        gc.collect()  # tracked weakly: gone from the hooks of later forks
    assert os.WEXITSTATUS(status) == 0  # a failing hook never fails the fork
    assert sorted(detached) == list(range(8))
