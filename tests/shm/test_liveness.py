from __future__ import annotations

import os

from gearshift.shm import liveness


def test_this_process_is_alive_and_its_identity_holds_its_pid() -> None:
    me = liveness.current()
    assert liveness.pid_of(me) == os.getpid()
    assert liveness.alive(me)


def test_no_identity_is_dead() -> None:
    assert not liveness.alive(0)
    assert liveness.identity(liveness.PID_MASK) == 0  # beyond any pid Linux hands out


def test_a_reused_pid_does_not_pass_for_the_dead_process() -> None:
    me = liveness.current()
    earlier = ((me >> liveness.PID_BITS) - 1) << liveness.PID_BITS | os.getpid()
    assert not liveness.alive(earlier)


def test_an_exited_child_is_dead_even_as_an_unreaped_zombie() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    ident = liveness.identity(pid)  # may already be 0 if the child exited first
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # exited, still a zombie
        assert liveness.identity(pid) == 0
        assert not liveness.alive(ident)
    finally:
        os.waitpid(pid, 0)
