"""The controller's publication journal, and what makes an accepted snapshot torn.

The stress run's controller publishes through `JournaledRegion`, which appends one record per
device publication to its own file `journal.<n>` (one per controller incarnation) before the
publishing store, with one write:

    offset  size    field
    0       8       device (u64)
    8       8       version (u64)
    16      8       CLOCK_MONOTONIC ns just before the publish (i64)
    24      8       payload length (u64)
    32      length  payload: the msgpack bytes published

So a snapshot a reader accepts is journaled by then. A controller killed after the record and
before the store leaves a record of a version its successor publishes again (the journal then
has two payloads for it, one never visible); one killed mid-write leaves a partial last record,
which `Journal` never reads.
"""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

from gearshift.shm import SnapshotRegion, codec

RECORD = struct.Struct("<QQqQ")
FILES = "journal.*"


class JournaledRegion(SnapshotRegion):
    """A device's snapshot region that journals each publication into the file `journal` (an
    fd, set once by the controller process) before publishing it. The version is predicted
    as `publish` computes it: this process is the region's only writer."""

    journal = -1

    def publish(self, payload: object, at_least: int = 0) -> int:
        data = codec.pack(payload)
        version = max(self.version() + 1, at_least)
        device = int(self.segment.name.rpartition(".")[2])
        os.write(self.journal, RECORD.pack(device, version, time.monotonic_ns(), len(data)) + data)
        return super().publish(payload, at_least)


class Journal:
    """The journal files of a directory, read as they grow: `entries` maps (device, version)
    to its [(time ns, payload bytes)], in the order they were written."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.entries: dict[tuple[int, int], list[tuple[int, bytes]]] = {}
        self._offsets: dict[Path, int] = {}

    def refresh(self) -> Journal:
        """Read the complete records written since the last refresh."""
        for path in sorted(self.directory.glob(FILES)):
            offset = self._offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            at = 0
            while at + RECORD.size <= len(data):
                device, version, t_ns, length = RECORD.unpack_from(data, at)
                end = at + RECORD.size + length
                if end > len(data):
                    break
                self.entries.setdefault((device, version), []).append(
                    (t_ns, data[at + RECORD.size : end])
                )
                at = end
            self._offsets[path] = offset + at
        return self

    def payloads(self, device: int, version: int) -> list[object]:
        """The payloads journaled for (device, version), refreshing first if there is none."""
        if (device, version) not in self.entries:
            self.refresh()
        return [codec.unpack(p, len(p)) for _, p in self.entries.get((device, version), [])]


def torn(
    device: int, version: int, payload: object, previous: tuple[int, object], journal: Journal
) -> str:
    """Why a snapshot a reader accepted from `device`'s region is not one the controller
    published, "" if it is; `previous` is the (version, payload) it accepted last there."""
    last, last_payload = previous
    if version < last:
        return f"version_went_down_from_{last}"
    if version == last:
        return "" if payload == last_payload else "another_payload_under_the_same_version"
    if not isinstance(payload, dict) or payload.get("device") != device:
        return "another_device"
    return "" if payload in journal.payloads(device, version) else "not_published"
