"""A full /dev/shm (a private tmpfs, `faults.full_shm`): no process dies of SIGBUS; a worker
with no room for its ring serves unrecorded and gets one at a later try, the controller refuses
a registration whose region has no room and goes on consuming the other workers' events."""

from __future__ import annotations

import pytest

from gearshift.tools.stress import faults


def test_a_worker_and_the_controller_survive_a_full_dev_shm() -> None:
    found = faults.full_shm()
    if found is None:
        pytest.skip("no private mount namespace with a tmpfs on /dev/shm can be made here")
    assert found["exit"] == 0, found["log"]
    assert found["serve_exit"] == 0, found["serve_log"]  # before: SIGBUS (-7)
    assert found["serve_warned"]  # /dev/shm is smaller than its 4 slots need
    b, c = found["b"], found["c"]
    assert b["exit"] == 0 and b["slot"] is None, b["log"]  # before: SIGBUS
    assert b["unrecorded"] == faults.B_ROUTES and b["attached"]  # its ring at a later try
    assert b["log"].count("no room for /gearshift.") == 1  # said once
    assert c["exit"] == 0 and c["refused"] == "SpaceError", c  # before: SIGBUS
    assert ".snap.1: it needs" in c["message"] and "--shm-size" in c["message"]
    assert found["all_consumed"] and found["consumed"] == found["recorded"]
