"""Processes in pid namespaces of their own (`unshare --pid --fork --mount-proc`), sharing
/dev/shm with the test: how a Kubernetes sidecar and its workers (no shareProcessNamespace), or
a `docker run --ipc=container:...` pair, see each other. Needs root (or user namespaces);
`needs_pidns` skips a test, saying why, where none can be made.

`Isolated(call)` runs `call` (Python, with `isolated_procs`' names in scope) in a new pid
namespace (with `time_offset`, a time namespace whose monotonic clock is that many seconds
ahead too); it reads the child's stdout lines (`expect`), writes commands to its stdin (`send`),
and `kill` ends it (--kill-child: the inner process dies with unshare).
"""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

import pytest

TESTS = Path(__file__).parent
WAIT = 20.0


@functools.cache
def unavailable(time: bool = False) -> str | None:
    """Why no pid (and, with `time`, time) namespace can be made here; None if one can."""
    if shutil.which("unshare") is None:
        return "needs unshare(1)"
    argv = ["unshare", "--pid", "--fork", "--mount-proc"]
    if time:
        argv += ["--time", "--monotonic=1000"]
    try:
        done = subprocess.run([*argv, "true"], capture_output=True, text=True, timeout=WAIT)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare failed: {e}"
    if done.returncode:
        return f"cannot create a {'time' if time else 'pid'} namespace: {done.stderr.strip()}"
    return None


needs_pidns = pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
needs_timens = pytest.mark.skipif(
    unavailable(time=True) is not None, reason=str(unavailable(time=True))
)


class Isolated:
    """A child in a pid namespace of its own; see the module docstring."""

    def __init__(self, call: str, time_offset: int = 0, argv: list[str] | None = None) -> None:
        code = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); "
                f"from isolated_procs import *; {call}")
        wrap = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
        if time_offset:
            wrap += ["--time", f"--monotonic={time_offset}", f"--boottime={time_offset}"]
        self.proc = subprocess.Popen(
            [*wrap, *(argv or [sys.executable, "-c", code])],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=self._read, args=(self.proc.stdout, self.lines.put),
                         daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, self.err.append),
                         daemon=True).start()

    @staticmethod
    def _read(stream: IO[str], put: Callable[[str], object]) -> None:
        for line in stream:
            put(line.rstrip("\n"))

    def expect(self, prefix: str, timeout: float = WAIT) -> str:
        """The child's next stdout line starting with `prefix` (others are skipped)."""
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(
                    f"no {prefix!r} from the isolated child in {timeout} s; stderr: "
                    + "\n".join(self.err[-30:])
                ) from None
            if line.startswith(prefix):
                return line

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def inner_pid(self) -> int:
        """The host's pid of the process unshare forked (pid 1 of the new namespace)."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        for _ in range(200):
            found = children.read_text().split()
            if found:
                return int(found[0])
            threading.Event().wait(0.01)
        raise AssertionError("unshare forked no child")

    def signal(self, sig: int) -> None:
        os.kill(self.inner_pid(), sig)

    def wait(self, timeout: float = WAIT) -> int:
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(AssertionError, ProcessLookupError, FileNotFoundError):
                os.kill(self.inner_pid(), signal.SIGKILL)
            self.proc.kill()
        self.proc.wait(WAIT)
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    @property
    def stderr(self) -> str:
        return "\n".join(self.err)
