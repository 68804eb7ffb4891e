"""Snapshot region: one per device, one writer (the controller), any number of readers (workers).

    offset          size      field       written by  when
    0               8         magic       creator     once, last of the header
    8               8         layout      creator     once
    16              8         capacity    creator     once (payload bytes per buffer, k * 64)
    64              8         state       writer      version << 2 | buffer << 1 | writing
    128 + b*B       8         seq[b]      writer      2v once buffer b holds version v; odd
    128 + b*B + 8   8         length[b]   writer      while seq[b] is odd
    128 + b*B + 16  8         crc32[b]    writer      while seq[b] is odd
    128 + b*B + 64  capacity  payload[b]  writer      while seq[b] is odd
    (two buffers, b = 0, 1, each B = 64 + capacity bytes; `buffer` holds `version`)

Publishing version v (> the current version c, which buffer b holds): state := c, b, writing;
seq[1-b] := 2v - 1 (odd); write payload, length, crc32; seq[1-b] := 2v; state := v, 1-b.
Every word is one aligned 8-byte store, in this order (`fence()` on weakly ordered CPUs).

Why a reader never accepts a torn payload: it reads v and b from state, then seq[b], the
payload, and seq[b] again, and accepts only if both reads of seq equal 2v (unchanged across the
read; versions only grow, so a seq value never comes back) and the crc32 matches. A copy under a
seq that stayed 2v was not being written, so a crc32 that fails then, or a length over the
capacity, means the buffer is corrupt: PayloadError at once, no retry; a reader copies a
payload at most COPY_ATTEMPTS times (then PayloadError), and capacities beyond MAX_CAPACITY are
refused at attach, so one read costs a bounded time whatever the header says. The writer
touches buffer b again only in the publish after next, and marks it odd first, so a copy taken
while it was being rewritten is always refused and retried. A publish in progress never
touches the current version's buffer, so readers, including one that starts mid-write, get the
previous good copy without waiting, and a writer publishing at full speed cannot starve them.
A writer killed mid-publish leaves the writing bit set; the last good version stays readable
and the next writer simply publishes into the other buffer again.

Worker API: `version()` is one 8-byte read ("has it changed?"); `read()` returns the latest
`Snapshot(version, payload)`, or None before the first publish. Controller API:
`publish(payload, at_least=0)` encodes msgpack, refuses a payload over `capacity` with
PayloadError, and returns the new version: the current one + 1, or `at_least` if larger (a
restarted controller keeps its versions increasing), at most MAX_VERSION (the 32 bits a ring
record carries; PayloadError beyond). `create`/`attach` name the region by
device; `create_named`/`attach_named` take any name of the namespace (the status region).
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

from gearshift.errors import NamespaceBusy, PayloadError
from gearshift.shm import codec, names
from gearshift.shm.segment import LINE, Segment, fence

MAGIC = int.from_bytes(b"gs.snap\0", "little")
LAYOUT = 1
CAPACITY = 2  # header constant word index
STATE = 64  # byte offsets
_STATE = STATE // 8  # its word index
BUFFERS = 128
SEQ, LENGTH, CRC, PAYLOAD = 0, 8, 16, 64  # offsets inside a buffer
DEFAULT_CAPACITY = 1 << 20  # a device's 256 profiles x 4 dims x 64 gears, 256-char names
MAX_CAPACITY = 16 << 20  # the largest capacity an attacher accepts
MAX_VERSION = 0xFFFFFFFF  # versions fit the 32-bit version field of a ring record
READ_ATTEMPTS = 1000  # a read re-reads state at most this often before it calls the region corrupt
COPY_ATTEMPTS = 16  # ... and copies a payload at most this often


class Snapshot(NamedTuple):
    version: int
    payload: object


class SnapshotRegion:
    """The snapshot region of `device` in `namespace`; see the module docstring for roles."""

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        self.capacity = segment.words[CAPACITY]
        self._words = segment.words
        self._mm = segment.mm

    @classmethod
    def create(
        cls, namespace: str, device: int, capacity: int = DEFAULT_CAPACITY
    ) -> SnapshotRegion:
        """Create device `device`'s region (the controller); NamespaceBusy if it exists."""
        return cls.create_named(names.snapshot(namespace, device), capacity)

    @classmethod
    def attach(cls, namespace: str, device: int) -> SnapshotRegion:
        """Attach device `device`'s region; FileNotFoundError if the controller has not made it."""
        return cls.attach_named(names.snapshot(namespace, device))

    @classmethod
    def open(cls, namespace: str, device: int) -> SnapshotRegion:
        """Device `device`'s region, created if it does not exist yet (the controller)."""
        return cls.open_named(names.snapshot(namespace, device))

    @classmethod
    def open_named(cls, name: str, capacity: int = DEFAULT_CAPACITY) -> SnapshotRegion:
        """The region `name`, created with `capacity` if it does not exist yet."""
        try:
            return cls.create_named(name, capacity)
        except NamespaceBusy:
            return cls.attach_named(name)

    @classmethod
    def create_named(cls, name: str, capacity: int = DEFAULT_CAPACITY) -> SnapshotRegion:
        if not LINE <= capacity <= MAX_CAPACITY or capacity % LINE:
            raise ValueError(
                f"snapshot capacity must be a multiple of {LINE} up to {MAX_CAPACITY}"
            )
        segment = Segment.create(name, BUFFERS + 2 * (PAYLOAD + capacity))
        return cls(segment.seal(MAGIC, LAYOUT, (capacity,)))

    @classmethod
    def attach_named(cls, name: str) -> SnapshotRegion:
        segment = Segment.attach(name, MAGIC, LAYOUT)
        capacity = segment.words[CAPACITY]
        valid = LINE <= capacity <= MAX_CAPACITY and capacity % LINE == 0
        return cls(segment.require(valid, BUFFERS + 2 * (PAYLOAD + capacity)))

    def version(self) -> int:
        """The latest completely published version (0: none yet)."""
        return self._words[_STATE] >> 2

    def read(self) -> Snapshot | None:
        """The latest published snapshot, never a torn one; PayloadError if it is corrupt (or
        stays inconsistent over the attempts)."""
        name, words, copies = self.segment.name, self._words, 0
        for _ in range(READ_ATTEMPTS):
            state = words[_STATE]
            version = state >> 2
            if version == 0:
                return None
            base = self._buffer((state >> 1) & 1)
            seq = words[base // 8]
            if seq != 2 * version:  # the writer is already rewriting this buffer: re-read state
                continue
            fence()
            length, crc = words[(base + LENGTH) // 8], words[(base + CRC) // 8]
            if length > self.capacity:
                data = b""
            else:
                data = self._mm[base + PAYLOAD : base + PAYLOAD + length]
                copies += 1
            fence()
            if words[base // 8] != seq:  # rewritten meanwhile: the copy may be torn
                if copies >= COPY_ATTEMPTS:
                    break
                continue
            if length > self.capacity:
                raise PayloadError(
                    f"{name}: version {version}: length {length} exceeds the capacity "
                    f"{self.capacity}"
                )
            if zlib.crc32(data) != crc:
                raise PayloadError(f"{name}: version {version} fails its crc32 (corrupt)")
            return Snapshot(version, codec.unpack(data, self.capacity))
        raise PayloadError(f"{name}: no consistent snapshot in {READ_ATTEMPTS} reads")

    def publish(self, payload: object, at_least: int = 0) -> int:
        """Publish `payload` as version max(current + 1, at_least) and return it (one writer)."""
        data = codec.pack(payload)
        if len(data) > self.capacity:
            raise PayloadError(
                f"{self.segment.name}: snapshot of {len(data)} bytes exceeds the region's "
                f"capacity of {self.capacity} bytes"
            )
        state = self._words[_STATE] & ~1  # a writer that died mid-publish left the bit set
        version = max((state >> 2) + 1, at_least)
        if version > MAX_VERSION:
            raise PayloadError(f"{self.segment.name}: version {version} exceeds {MAX_VERSION}")
        target = 1 - ((state >> 1) & 1)
        base = self._buffer(target)
        self._words[_STATE] = state | 1
        self._words[base // 8] = 2 * version - 1
        fence()
        self._mm[base + PAYLOAD : base + PAYLOAD + len(data)] = data
        self._words[(base + LENGTH) // 8] = len(data)
        self._words[(base + CRC) // 8] = zlib.crc32(data)
        fence()
        self._words[base // 8] = 2 * version
        self._words[_STATE] = version << 2 | target << 1
        return version

    def _buffer(self, index: int) -> int:
        return BUFFERS + index * (PAYLOAD + self.capacity)

    def close(self) -> None:
        self.segment.close()

    def unlink(self) -> bool:
        return self.segment.unlink()
