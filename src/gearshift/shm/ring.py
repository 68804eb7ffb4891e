"""Event ring: one per worker slot, single producer (the worker), single consumer (the controller).

    offset  size          field        written by  when
    0       8             magic        creator     once, last of the header
    8       8             layout       creator     once
    16      8             capacity     creator     once (records; a power of two)
    24      8             record_size  creator     once (EVENT_DTYPE.itemsize)
    64      8             head         producer    after the record it publishes is written
    128     8             tail         consumer    after the records it takes are copied out
    192     8             dropped      producer    when an event finds the ring full
    256     64*capacity   records      producer    record i at 256 + 64 * (i % capacity)

Record (EVENT_DTYPE, little-endian; written by the producer before head moves past it):

    offset  size  field    meaning
    0       8     t_ns     CLOCK_MONOTONIC time of the event, ns (int64)
    8       32    values   raw dim values in dim order; MEMORY: free, total bytes; MEASURED,
                           BUFFERS below
    40      4     version  snapshot version the request was routed with (uint32)
    44      2     profile  the worker's profile id (uint16)
    46      1     kind     Kind: SHAPE, EAGER, MEMORY, RECORDED, MEASURED, BUFFERS; 0 never
    47      1     ndim     dims used, 1..4 (the others are 0); MEASURED, BUFFERS: 4
    48      8     chunks   graph runs per dim (uint16 each); MEASURED, BUFFERS: the dim's index
    56      8     (pad)    one record per cache line

`head` and `tail` count records since creation and never wrap; the ring holds [tail, head).
Each counter has one writer and sits on its own cache line. Why the consumer never sees a torn
record: the producer writes record `head` completely, then publishes head+1 with one aligned
8-byte store (`fence()` between them on weakly ordered CPUs); the consumer reads head first, so
every record below it is complete, and the producer never rewrites a record before the consumer
has moved `tail` past it, which it does only after copying. A producer killed mid-record has not
moved head: its half-written record is invisible.

Producer (worker, request path): `put(t_ns, profile, version, values, chunks)`, its packed form
`write(t_ns, v0, v1, v2, v3, meta, counts)` and `put_memory(t_ns, free, total)` never block,
make no syscall and allocate no buffer (the threads of the producing process serialise on a
process-local lock, held for the few stores of one record): a full ring drops the event,
counts it in `dropped` and returns False. The producer reads `tail` again only when head
reaches the last reading + capacity. Callers pass validated ints (the client checks shapes);
a malformed call raises before anything is published.
Consumer (controller): `drain(max_events)` returns a copy of [tail, head) as an EVENT_DTYPE array,
oldest first, then publishes tail.

A MEASURED record reports one graph the worker captured, one record per dim of its profile
(`measured`): values = (the dim's gear, capture ns, graph bytes, replay ns), version = the
profile's snapshot version when it is written, chunks = the dim's index in its dim order. The
worker's swap thread writes it through the same `write` (and producer lock) as requests, never
a request thread, so it is published and read exactly as they are; the controller checks every
field of it as it checks a request's. A ring record rather than a mailbox message: a mailbox
holds one message at a time and carries registrations, while the ring is drained every
iteration; measurements are rare (one per dim of each capture), and a full ring drops one like
any record.

A BUFFERS record reports the bytes of the static input buffers a profile's graphs share on the
worker (`buffers`), one record per dim, written as MEASURED records are, when they change and
again every few seconds: values = (the dim's gear the buffers are sized at, the buffers' bytes
in all, the bytes of those with an axis on the dim, 0), version and chunks as MEASURED's. The
layout is unchanged: a reader that knows no BUFFERS counts the record invalid.
"""

from __future__ import annotations

import enum
import struct
import sys
import threading
from collections.abc import Sequence

import numpy as np

from gearshift.core.dims import MAX_DIMS
from gearshift.errors import LayoutError
from gearshift.shm import names
from gearshift.shm.segment import WEAK_ORDERING, Segment, fence

MAGIC = int.from_bytes(b"gs.ring\0", "little")
LAYOUT = 1
CAPACITY, RECORD_SIZE = 2, 3  # header constant word indices
HEAD, TAIL, DROPPED = 64, 128, 192  # byte offsets, one cache line each
_HEAD, _TAIL, _DROPPED = HEAD // 8, TAIL // 8, DROPPED // 8  # their word indices
RECORDS = 256
DEFAULT_CAPACITY = 1 << 16
MAX_CAPACITY = 1 << 22  # the largest capacity an attacher accepts (256 MiB of records)


class Kind(enum.IntEnum):
    """What a record reports; 0 is never written, so a zeroed slot is recognisably empty."""

    SHAPE = 1  # a request ran on graphs: values = raw dims, chunks = graph runs per dim
    EAGER = 2  # a request ran eagerly (over a non-splittable dim's largest gear, or no graph)
    MEMORY = 3  # a device memory reading: values = (free bytes, total bytes)
    RECORDED = 4  # a request only recorded (`record()`): it ran on an engine's own graphs
    MEASURED = 5  # one dim of a graph the worker captured: gear, capture ns, bytes, replay ns
    BUFFERS = 6  # one dim of a profile's static buffers: its gear, bytes, bytes on the dim, 0


EVENT_DTYPE = np.dtype(
    {
        "names": ["t_ns", "values", "version", "profile", "kind", "ndim", "chunks"],
        "formats": ["<i8", ("<i8", MAX_DIMS), "<u4", "<u2", "u1", "u1", ("<u2", MAX_DIMS)],
        "offsets": [0, 8, 40, 44, 46, 47, 48],
        "itemsize": 64,  # bytes 56..63 are padding: one record per cache line
    }
)
RECORD = EVENT_DTYPE.itemsize


# EVENT_DTYPE with bytes 40..47 and 48..55 as one word each, in native longs where those are
# little-endian 64-bit (CPython converts a long long of over 30 bits through a byte array, a
# long digit by digit: 20 ns less per record)
_NATIVE = sys.byteorder == "little" and struct.calcsize("l") == 8
_RECORD = struct.Struct(f"@l{MAX_DIMS}lLL8x" if _NATIVE else f"<q{MAX_DIMS}qQQ8x")
assert _RECORD.size == RECORD
_pack = _RECORD.pack_into
_ZEROS = (0,) * MAX_DIMS


def meta(profile: int, version: int, kind: int, ndim: int) -> int:
    """Bytes 40..47 of a record (version, profile, kind, ndim) as one word; the version is
    taken modulo 2**32 (its field's width), so it never spills into the profile id."""
    return version & 0xFFFFFFFF | profile << 32 | kind << 48 | ndim << 56


def counts(chunks: Sequence[int]) -> int:
    """Bytes 48..55 of a record (chunk count per dim, 16 bits each) as one word."""
    word = 0
    for i, count in enumerate(chunks):
        word |= count << 16 * i
    return word


def measured(
    profile: int, version: int, dim: int, gear: int, capture_seconds: float, graph_bytes: int,
    replay_seconds: float,
) -> tuple[int, int, int, int, int, int]:
    """`write`'s arguments after `t_ns` for a MEASURED record (module docstring): v0..v3,
    meta and counts. Seconds go as whole nanoseconds."""
    return (gear, round(capture_seconds * 1e9), graph_bytes, round(replay_seconds * 1e9),
            meta(profile, version, Kind.MEASURED, MAX_DIMS), dim)


def buffers(
    profile: int, version: int, dim: int, cap: int, total: int, scaling: int,
) -> tuple[int, int, int, int, int, int]:
    """`write`'s arguments after `t_ns` for a BUFFERS record (module docstring)."""
    return (cap, total, scaling, 0, meta(profile, version, Kind.BUFFERS, MAX_DIMS), dim)


class EventRing:
    """The ring of worker slot `slot` of `namespace`; see the module docstring for roles."""

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        words = segment.words
        self.capacity = words[CAPACITY]
        self._mask = self.capacity - 1
        self._words = words
        self._mm = segment.mm
        self._records = np.frombuffer(segment.mm, EVENT_DTYPE, self.capacity, RECORDS)
        self._head = words[_HEAD]  # producer's copy of its own word
        self._tail = words[_TAIL]  # consumer's copy of its own word
        self._dropped = words[_DROPPED]
        self._limit = self._tail + self.capacity  # head may reach it before tail is read again
        self._lock = threading.Lock()  # serialises the producer's threads, and close
        self._closed = False

    @classmethod
    def create(cls, namespace: str, slot: int, capacity: int = DEFAULT_CAPACITY) -> EventRing:
        """Create the ring (by the worker that claimed `slot`); capacity is a power of two."""
        if not 1 <= capacity <= MAX_CAPACITY or capacity & (capacity - 1):
            raise ValueError(
                f"ring capacity must be a power of two up to {MAX_CAPACITY}, got {capacity}"
            )
        size = RECORDS + capacity * RECORD
        segment = Segment.create(names.ring(namespace, slot), size)
        return cls(segment.seal(MAGIC, LAYOUT, (capacity, RECORD)))

    @classmethod
    def attach(cls, namespace: str, slot: int, timeout: float = 1.0) -> EventRing:
        """Attach an existing ring (the controller); FileNotFoundError if there is none,
        Unsealed if its creator has not sealed it within `timeout` (0: the controller, which
        never waits on a worker and retries at its next scan)."""
        segment = Segment.attach(names.ring(namespace, slot), MAGIC, LAYOUT, timeout=timeout)
        capacity, record = segment.words[CAPACITY], segment.words[RECORD_SIZE]
        valid = 0 < capacity <= MAX_CAPACITY and not capacity & (capacity - 1)
        valid = valid and record == RECORD
        return cls(segment.require(valid, RECORDS + capacity * RECORD))

    @property
    def name(self) -> str:
        return self.segment.name

    def put(
        self,
        t_ns: int,
        profile: int,
        version: int,
        values: Sequence[int],
        chunks: Sequence[int],
        kind: int = Kind.SHAPE,
    ) -> bool:
        """Record one event (1..4 raw dim values, as many chunk counts); False if dropped."""
        ndim = len(values)
        if not 1 <= ndim <= MAX_DIMS:
            raise ValueError(f"a record holds 1 to {MAX_DIMS} values, got {ndim}")
        padded = (*values, *_ZEROS[ndim:])
        return self.write(t_ns, *padded, meta(profile, version, kind, ndim), counts(chunks))

    def write(self, t_ns: int, v0: int, v1: int, v2: int, v3: int, meta: int, counts: int) -> bool:
        """`put` in packed form, the request path's: the 4 value slots (unused ones 0) and
        bytes 40..55 as two words (`meta`, `counts`). Fixed arity, so the record is one
        `pack_into` with plain positional arguments. False, and nothing written, once the
        ring is closed."""
        lock = self._lock
        lock.acquire()  # cheaper than `with` on the request path
        try:
            head = self._head
            if head >= self._limit and not self._room():
                return False
            offset = RECORDS + (head & self._mask) * RECORD
            _pack(self._mm, offset, t_ns, v0, v1, v2, v3, meta, counts)
            if WEAK_ORDERING:
                fence()
            self._head = head = head + 1
            self._words[_HEAD] = head  # the publishing store
            return True
        finally:
            lock.release()

    def _room(self) -> bool:
        """Under the producer lock, once head reached `_limit` (tail + capacity as last read):
        read tail again; a full ring counts a drop. False on a closed ring."""
        if self._closed:
            return False
        self._limit = self._words[_TAIL] + self.capacity
        if self._head < self._limit:
            return True
        self._dropped += 1
        self._words[_DROPPED] = self._dropped
        return False

    def put_memory(self, t_ns: int, free: int, total: int) -> bool:
        """Record a device memory reading in bytes; False if dropped."""
        return self.put(t_ns, 0, 0, (free, total), (0, 0), Kind.MEMORY)

    def drain(self, max_events: int | None = None) -> np.ndarray:
        """Copy out the oldest `max_events` (default all) unread events, then free their slots."""
        tail = self._tail
        count = self._words[_HEAD] - tail
        if not 0 <= count <= self.capacity:
            raise LayoutError(f"{self.name}: head {tail + count} and tail {tail} are inconsistent")
        if max_events is not None:
            count = min(count, max_events)
        fence()
        start = tail & self._mask
        first = min(count, self.capacity - start)
        events = np.concatenate(
            (self._records[start : start + first], self._records[: count - first])
        )
        fence()
        self._tail = tail + count
        self._words[_TAIL] = self._tail
        return events

    def pending(self) -> int:
        """Events published and not yet drained."""
        return self._words[_HEAD] - self._words[_TAIL]

    @property
    def dropped(self) -> int:
        """Events dropped on a full ring since its creation."""
        return self._words[_DROPPED]

    def close(self) -> None:
        """Unmap the ring (again: nothing); a producer thread's later `write` returns False."""
        with self._lock:
            if self._closed:
                return
            self._closed, self._limit = True, 0  # the next write goes to `_room`
            del self._records  # a numpy view: it must go before the mapping can close
            self.segment.close()

    def unlink(self) -> bool:
        return self.segment.unlink()
