"""gearshift's background threads start with the process's asynchronous signals blocked.

CPython runs a Python signal handler in the main thread, but the kernel delivers a
process-directed signal (`kill PID`'s SIGTERM, SIGINT, SIGHUP, ...) to any thread that does not
block it. Taken by a helper thread, it only sets the handler's flag: a main thread blocked in a
system call (a `time.sleep`, a `wait`) runs the handler when that call returns, so a worker
told to stop by SIGTERM could sleep on for a minute. A thread inherits the signal mask of the
thread that starts it; `start` starts one with `ASYNC` blocked, so that the kernel delivers those
signals to a thread that can take them at once: the main thread (or a thread of the
application's, which blocks what it wants).
"""

from __future__ import annotations

import signal
import threading

ASYNC = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                   signal.SIGUSR2, signal.SIGALRM})


def start(thread: threading.Thread) -> None:
    """`thread.start()`, the new thread's mask blocking `ASYNC`; the caller's mask unchanged."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, ASYNC)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
