"""Process identity that survives pid reuse: pid and kernel start time in one 64-bit word.

    ident = start_ticks << 22 | pid        (0 means "no process")

Linux pids are below 2**22 (PID_MAX_LIMIT) and start ticks (clock ticks since boot, field 22 of
/proc/<pid>/stat) fit the remaining 42 bits for centuries. Being one word, an identity is
published with one aligned 8-byte store and never read torn. A process is alive iff /proc still
shows the same pid with the same start time and it is not a zombie; a recycled pid has another
start time, so it never passes for the dead process. Pids and start times, hence identities,
mean something only inside the pid and time namespaces they were read in: a participant records
its `realm` beside its identity, and only a judge of the same realm checks the identity; others
watch its lease (lease.py).
"""

from __future__ import annotations

import os
import signal

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


def send_signal(ident: int, sig: int) -> bool:
    """Send `sig` to the process `ident` names; False if it is not alive. Where the kernel has
    pidfds (Linux 5.3+) a pidfd is opened first and the identity checked after, so the signal
    reaches that process and never a later one with its pid; elsewhere the check and the kill
    are two steps."""
    pid = pid_of(ident)
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):  # no pidfd on this system
        if not alive(ident):
            return False
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return False
        return True
    try:
        if not alive(ident):  # the pid is another process's now (or a zombie's)
            return False
        signal.pidfd_send_signal(fd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        os.close(fd)


_namespaces: tuple[int, int, int] = (0, 0, 0)  # (pid, pid ns, time ns) of the last reading
_INODE = (1 << 32) - 1  # namespace inodes are 32-bit (proc inode numbers)


def _read() -> tuple[int, int, int]:
    global _namespaces
    pid = os.getpid()
    if _namespaces[0] != pid:
        found = []
        for kind in ("pid", "time"):
            try:
                found.append(os.stat(f"/proc/self/ns/{kind}").st_ino & _INODE)
            except OSError:  # no /proc, or a kernel without time namespaces (before 5.6)
                found.append(0)
        _namespaces = (pid, found[0], found[1])
    return _namespaces


def pid_namespace() -> int:
    """The inode of this process's pid namespace (0 if /proc does not show it); read once per
    process (a process never changes its own pid namespace)."""
    return _read()[1]


def realm() -> int:
    """Where this process's identities mean something: its pid namespace's inode << 32 | its
    time namespace's (start times are shown relative to the time namespace). Never 0 where
    /proc shows the pid namespace; two processes of one realm judge each other's identities."""
    _, pid_ns, time_ns = _read()
    return pid_ns << 32 | time_ns
