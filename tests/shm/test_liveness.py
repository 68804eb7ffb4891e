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


def test_a_signal_reaches_the_process_named_and_never_a_later_one_with_its_pid() -> None:
    import signal
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ident = 0
        while not ident:
            ident = liveness.identity(child.pid)
        later = ((ident >> liveness.PID_BITS) + 1) << liveness.PID_BITS | child.pid
        assert not liveness.send_signal(later, signal.SIGTERM)  # its pid, another start time
        assert child.poll() is None
        assert liveness.send_signal(ident, signal.SIGTERM)
        assert child.wait(30) == -signal.SIGTERM
        assert not liveness.send_signal(ident, signal.SIGTERM)  # gone
    finally:
        child.kill()
        child.wait(30)


def test_the_pid_namespace_is_this_processs() -> None:
    assert liveness.pid_namespace() == os.stat("/proc/self/ns/pid").st_ino
