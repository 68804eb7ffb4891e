"""Process identity that survives pid reuse: pid and kernel start time in one 64-bit word.

    ident = start_ticks << 22 | pid        (0 means "no process")

Linux pids are below 2**22 (PID_MAX_LIMIT) and start ticks (clock ticks since boot, field 22 of
/proc/<pid>/stat) fit the remaining 42 bits for centuries. Being one word, an identity is
published with one aligned 8-byte store and never read torn. A process is alive iff /proc still
shows the same pid with the same start time and it is not a zombie; a recycled pid has another
start time, so it never passes for the dead process.
"""

from __future__ import annotations

import os

PID_BITS = 22
PID_MASK = (1 << PID_BITS) - 1


def identity(pid: int) -> int:
    """The identity of running process `pid`, or 0 if there is none (or it is a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return 0
    fields = stat[stat.rindex(b")") + 2 :].split()  # the command name may hold spaces and ')'
    if fields[0] in (b"Z", b"X"):  # state: zombie or dead
        return 0
    assert pid <= PID_MASK, f"pid {pid} exceeds {PID_BITS} bits"
    return int(fields[19]) << PID_BITS | pid  # fields[19] is stat field 22, starttime


def current() -> int:
    """The identity of this process."""
    return identity(os.getpid())


def alive(ident: int) -> bool:
    """True iff the process `ident` names is still running (not a later process with its pid)."""
    return ident != 0 and identity(ident & PID_MASK) == ident


def pid_of(ident: int) -> int:
    return ident & PID_MASK
