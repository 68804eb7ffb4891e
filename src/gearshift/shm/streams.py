"""Stream ledger: the device streams each process's graphs hold on one device of a namespace,
so that the processes sharing a device (an NPU's 2,048 streams) stop at its budget together.

    /gearshift.<ns>.streams.<dev>
    offset        size  field       written by
    0             64    header      creator (segment.py; constants: entries, budget)
    64+i*64       8     ident[i]    the process of entry i, under the ledger's flock
    64+i*64+8     8     streams[i]  the process of entry i, under the flock
    64+i*64+16    8     pidns[i]    the process of entry i, under the flock

`take(n)` adds `n` to this process's entry if every live entry's streams plus `n` fit the
budget, else refuses (returns what the others hold); `give(n)` takes them off. Both run under
an exclusive flock on the segment's file, which the kernel drops when its holder dies: no
repair, no stale lock. An entry whose process is dead (identity check, liveness.py) is cleared
by the next `take`; an entry of another pid namespace is counted (its liveness cannot be told
here). Nothing read is trusted: a header outside MAX_ENTRIES / MAX_BUDGET is a LayoutError, an
entry holding more than the budget counts as nothing and is logged (the device's own refusal,
npu 207008, stays the backstop), and a flock held past `timeout` is a refusal, not a wait.

The ledger counts this namespace's processes only, by the device index they register with (as
the controller's per-device snapshots do); processes outside it are what a backend's spare
streams cover. It is created by the first process that opens it and removed by `cleanup`.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading

from gearshift.clock import Clock, MonotonicClock
from gearshift.errors import NamespaceBusy
from gearshift.shm import liveness, names, segment
from gearshift.shm.segment import CONSTANTS, LINE, Segment

log = logging.getLogger(__name__)
MAGIC = 0x6773_7472_6561_6D73  # "gstreams"
LAYOUT = 1
ENTRIES = 64  # processes per device of a namespace that may hold graphs
MAX_ENTRIES = 4096
MAX_BUDGET = 1 << 20
IDENT, STREAMS, PIDNS = 0, 1, 2  # word offsets in an entry's line
WORDS = LINE // 8


class StreamLedger:
    """One device's ledger, opened (or created) by `open`; `held` is this process's count."""

    def __init__(self, seg: Segment, fd: int, clock: Clock, timeout: float) -> None:
        self.seg, self.fd, self.clock, self.timeout = seg, fd, clock, timeout
        words = seg.words
        self.entries, self.budget = words[CONSTANTS], words[CONSTANTS + 1]
        self.held = 0
        self._mine: tuple[int, int] | None = None  # (pid, entry) of this process's entry
        self._lock = threading.Lock()

    @classmethod
    def open(
        cls,
        namespace: str,
        device: int,
        budget: int,
        entries: int = ENTRIES,
        clock: Clock | None = None,
        timeout: float = 1.0,
    ) -> StreamLedger:
        """Attach the device's ledger, creating it (with `budget` and `entries`) if there is
        none; NotOwned, LayoutError, SpaceError as a segment's."""
        assert 0 < budget <= MAX_BUDGET and 0 < entries <= MAX_ENTRIES
        name, clock = names.streams(namespace, device), clock or MonotonicClock()
        try:
            seg = Segment.create(name, LINE * (1 + entries)).seal(MAGIC, LAYOUT, [entries, budget])
        except NamespaceBusy:  # another process made it first
            seg = Segment.attach(name, MAGIC, LAYOUT, clock)
            n, b = seg.words[CONSTANTS], seg.words[CONSTANTS + 1]
            seg.require(0 < n <= MAX_ENTRIES and 0 < b <= MAX_BUDGET, LINE * (1 + n))
        try:
            fd = os.open(segment.path(name), os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            seg.close()
            raise
        if (os.fstat(fd).st_dev, os.fstat(fd).st_ino) != seg.inode:  # replaced meanwhile
            os.close(fd)
            seg.close()
            raise NamespaceBusy(f"{name} was replaced while it was opened")
        return cls(seg, fd, clock, timeout)

    def take(self, n: int) -> int | None:
        """Add `n` streams to this process's count if the ledger's total stays within the
        budget: None; else the streams the others hold (nothing taken)."""
        with self._lock, self._flocked() as locked:
            if not locked:
                return self.budget
            others = self._others()
            entry = self._entry()
            if entry is None:
                log.warning("%s: all %d entries are taken by live processes",
                            self.seg.name, self.entries)
            if entry is None or others + self.held + n > self.budget:
                return others
            self.held += n
            self.seg.words[(1 + entry) * WORDS + STREAMS] = self.held
            return None

    def give(self, n: int) -> None:
        """Take `n` streams off this process's count (never below 0)."""
        with self._lock, self._flocked() as locked:
            self.held = max(self.held - n, 0)
            if self._mine is not None and self._mine[0] == os.getpid():
                words, entry = self.seg.words, self._mine[1]
                if locked:  # else the next take writes it (or the entry dies with us)
                    words[(1 + entry) * WORDS + STREAMS] = self.held

    def total(self) -> int:
        """Streams held by every live process (this one included), read under the flock."""
        with self._lock, self._flocked() as locked:
            return self._others() + self.held if locked else self.budget

    def close(self) -> None:
        os.close(self.fd)
        self.seg.close()

    def unlink(self) -> bool:
        return self.seg.unlink()

    # inside: under the flock

    def _flocked(self) -> _Flock:
        return _Flock(self.fd, self.clock, self.timeout)

    def _others(self) -> int:
        """Streams of the other live entries; dead ones are cleared, corrupt ones count 0."""
        words, mine = self.seg.words, self._entry_index()
        ns, total = liveness.pid_namespace(), 0
        for i in range(self.entries):
            base = (1 + i) * WORDS
            ident, streams = words[base + IDENT], words[base + STREAMS]
            if i == mine or ident == 0:
                continue
            if words[base + PIDNS] == ns and not liveness.alive(ident):
                words[base + STREAMS] = words[base + IDENT] = 0
                continue
            if streams > self.budget:
                log.warning("%s: entry %d holds %d streams, over the budget %d: not counted",
                            self.seg.name, i, streams, self.budget)
                continue
            total += streams
        return total

    def _entry_index(self) -> int | None:
        mine = self._mine
        return mine[1] if mine is not None and mine[0] == os.getpid() else None

    def _entry(self) -> int | None:
        """This process's entry, claiming a free one on first use (None: the ledger is full)."""
        index = self._entry_index()
        if index is not None:
            return index
        words, me, ns = self.seg.words, liveness.current(), liveness.pid_namespace()
        for i in range(self.entries):
            base = (1 + i) * WORDS
            if words[base + IDENT] == 0:  # one entry per ledger object
                words[base + STREAMS] = self.held = 0  # a forked child starts with none
                words[base + PIDNS] = ns
                words[base + IDENT] = me
                self._mine = (os.getpid(), i)
                return i
        return None


class _Flock:
    """An exclusive flock on `fd`, tried until `timeout` (entered as True if taken)."""

    def __init__(self, fd: int, clock: Clock, timeout: float) -> None:
        self.fd, self.clock, self.timeout, self.locked = fd, clock, timeout, False

    def __enter__(self) -> bool:
        deadline = self.clock.now() + self.timeout
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.locked = True
                return True
            except BlockingIOError:
                if self.clock.now() >= deadline:
                    log.warning("a stream ledger stayed locked for %.1f s", self.timeout)
                    return False
                self.clock.sleep(0.0005)

    def __exit__(self, *exc: object) -> None:
        if self.locked:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            self.locked = False
