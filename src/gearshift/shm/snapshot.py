"""Snapshot region: one per device, one writer (the controller), any number of readers (workers).

    offset          size      field       written by  when
    0               8         magic       creator     once, last of the header
    8               8         layout      creator     once
    16              8         capacity    creator     once (payload bytes per buffer, k * 64)
    64              8         state       writer      version << 1 | writing (odd mid-publish)
    128 + b*B       8         seq[b]      writer      2v once buffer b holds version v; odd
    128 + b*B + 8   8         length[b]   writer      while seq[b] is odd
    128 + b*B + 16  8         crc32[b]    writer      while seq[b] is odd
    128 + b*B + 64  capacity  payload[b]  writer      while seq[b] is odd
    (two buffers, b = 0, 1, each B = 64 + capacity bytes; version v lives in buffer v % 2)

Publishing version v = (state >> 1) + 1: state := 2v - 1 (odd); seq[v%2] := 2v - 1; write
payload, length, crc32; seq[v%2] := 2v; state := 2v. Every word is one aligned 8-byte store,
in this order (`fence()` on weakly ordered CPUs).

Why a reader never accepts a torn payload: it reads v = state >> 1, then seq[v%2], the payload,
and seq[v%2] again, and accepts only if both reads of seq equal 2v (unchanged across the read) and
the crc32 matches. The writer touches buffer v%2 again only while publishing v+2, and marks it
odd first, so a copy taken while it was being rewritten is always refused and retried. A publish
in progress never touches the buffer of the current version, so readers, including one that
starts mid-write, get the previous good copy without waiting, and a writer publishing at full
speed cannot starve them. A writer killed mid-publish leaves state odd; the last good version
stays readable and the next writer continues at version (state >> 1) + 1.

Worker API: `version()` is one 8-byte read ("has it changed?"); `read()` returns the latest
`Snapshot(version, payload)`, or None before the first publish. Controller API: `publish(payload)`
encodes msgpack, refuses a payload over `capacity` with PayloadError, returns the new version.
"""

from __future__ import annotations

import zlib
from typing import NamedTuple

from gearshift.errors import PayloadError
from gearshift.shm import codec, names
from gearshift.shm.segment import LINE, Segment, fence

MAGIC = int.from_bytes(b"gs.snap\0", "little")
LAYOUT = 1
CAPACITY = 2  # header constant word index
STATE = 64  # byte offsets
_STATE = STATE // 8  # its word index
BUFFERS = 128
SEQ, LENGTH, CRC, PAYLOAD = 0, 8, 16, 64  # offsets inside a buffer
DEFAULT_CAPACITY = 256 * 1024
READ_ATTEMPTS = 1000  # a read retries at most this often before it calls the region corrupt


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
        """Create the region (the controller); NamespaceBusy if it exists (then `attach`)."""
        if capacity < LINE or capacity % LINE:
            raise ValueError(f"snapshot capacity must be a positive multiple of {LINE}")
        size = BUFFERS + 2 * (PAYLOAD + capacity)
        segment = Segment.create(names.snapshot(namespace, device), size)
        return cls(segment.seal(MAGIC, LAYOUT, (capacity,)))

    @classmethod
    def attach(cls, namespace: str, device: int) -> SnapshotRegion:
        """Attach an existing region; FileNotFoundError if the controller has not created it."""
        segment = Segment.attach(names.snapshot(namespace, device), MAGIC, LAYOUT)
        capacity = segment.words[CAPACITY]
        valid = capacity > 0 and capacity % LINE == 0
        return cls(segment.require(valid, BUFFERS + 2 * (PAYLOAD + capacity)))

    def version(self) -> int:
        """The latest completely published version (0: none yet)."""
        return self._words[_STATE] >> 1

    def read(self) -> Snapshot | None:
        """The latest published snapshot, never a torn one; PayloadError if it stays corrupt."""
        for _ in range(READ_ATTEMPTS):
            version = self._words[_STATE] >> 1
            if version == 0:
                return None
            base = self._buffer(version)
            seq = self._words[base // 8]
            if seq != 2 * version:  # the writer is already rewriting this buffer: re-read state
                continue
            fence()
            length = min(self._words[(base + LENGTH) // 8], self.capacity)
            crc = self._words[(base + CRC) // 8]
            data = self._mm[base + PAYLOAD : base + PAYLOAD + length]
            fence()
            if self._words[base // 8] == seq and zlib.crc32(data) == crc:
                return Snapshot(version, codec.unpack(data, self.capacity))
        raise PayloadError(f"{self.segment.name}: no consistent snapshot in {READ_ATTEMPTS} reads")

    def publish(self, payload: object) -> int:
        """Publish `payload` as the next version and return it (single writer)."""
        data = codec.pack(payload)
        if len(data) > self.capacity:
            raise PayloadError(
                f"{self.segment.name}: snapshot of {len(data)} bytes exceeds the region's "
                f"capacity of {self.capacity} bytes"
            )
        version = (self._words[_STATE] >> 1) + 1
        base = self._buffer(version)
        self._words[_STATE] = 2 * version - 1
        self._words[base // 8] = 2 * version - 1
        fence()
        self._mm[base + PAYLOAD : base + PAYLOAD + len(data)] = data
        self._words[(base + LENGTH) // 8] = len(data)
        self._words[(base + CRC) // 8] = zlib.crc32(data)
        fence()
        self._words[base // 8] = 2 * version
        self._words[_STATE] = 2 * version
        return version

    def _buffer(self, version: int) -> int:
        return BUFFERS + (version & 1) * (PAYLOAD + self.capacity)

    def close(self) -> None:
        self.segment.close()

    def unlink(self) -> bool:
        return self.segment.unlink()
