"""Tests' helper for forked children: reap one within a bound, killing it past that."""

from __future__ import annotations

import os
import signal
import time


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
