"""Tests' helpers for forked children: reap one within a bound, killing it past that; run a
body in one and read back what it wrote."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable


def reap(pid: int, seconds: float) -> int:
    """Wait up to `seconds` for child `pid` to exit; SIGKILL it past that (a hung child fails
    its test instead of hanging the suite). Its wait status: the exit's, or the kill's."""
    deadline = time.monotonic() + seconds
    while (waited := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            return os.waitpid(pid, 0)[1]
        time.sleep(0.01)
    return waited[1]


def in_child(body: Callable[[], str], seconds: float, alarm: int = 20) -> tuple[int, str]:
    """Fork; the child runs `body` (SIGALRM after `alarm` s), writes what it returns to a pipe
    and exits, 0 once written, 1 if it raised, never returning into pytest; the parent reaps
    it within `seconds` (`reap`). Its wait status and what it wrote."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(alarm)
            os.write(write, body().encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    status = reap(pid, seconds)
    with os.fdopen(read, "rb") as f:
        return status, f.read().decode()
