"""What a node needs in /dev/shm, and `serve`'s start-up check of it.

Every segment is reserved whole when it is created (shm/segment.py), in tmpfs pages: the
namespace's fixed part (the control segment of its slots, the lock, the status region), one
event ring per worker and one snapshot region per device. A segment that does not fit is
refused (SpaceError): a worker serves unrecorded, a registration on a new device is refused.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass

from gearshift.controller import status
from gearshift.shm import control, ring, snapshot
from gearshift.shm.mailbox import Mailbox
from gearshift.shm.segment import SHM_DIR


@dataclass(frozen=True)
class Footprint:
    """Bytes of /dev/shm: `fixed` per namespace, `per_worker`, `per_device`."""

    fixed: int
    per_worker: int
    per_device: int

    def total(self, workers: int, devices: int) -> int:
        return self.fixed + workers * self.per_worker + devices * self.per_device


def footprint(slots: int = control.DEFAULT_SLOTS, page: int = mmap.PAGESIZE) -> Footprint:
    """The footprint of a namespace of `slots` slots with the default capacities, in whole
    pages of `page` bytes."""
    slot = control.REQUESTS + 2 * Mailbox.size(control.DEFAULT_MAILBOX_CAPACITY)
    regions = (status.CAPACITY, snapshot.DEFAULT_CAPACITY)
    status_region, device_region = (
        _pages(snapshot.BUFFERS + 2 * (snapshot.PAYLOAD + capacity), page) for capacity in regions
    )
    lock = page  # the semaphore's file
    return Footprint(
        fixed=_pages(control.TABLE + slots * slot, page) + lock + status_region,
        per_worker=_pages(ring.RECORDS + ring.DEFAULT_CAPACITY * ring.RECORD, page),
        per_device=device_region,
    )


def mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def check(slots: int, path: str = SHM_DIR) -> str | None:
    """A warning if the mount at `path` is smaller than a namespace of `slots` slots needs with
    every slot's worker and one device; None if it is large enough (or cannot be read)."""
    try:
        fs = os.statvfs(path)
    except OSError:
        return None
    size, need = fs.f_blocks * fs.f_frsize, footprint(slots)
    if size >= need.total(slots, 1):
        return None
    room = max(0, (size - need.fixed - need.per_device) // need.per_worker)
    return (
        f"{path} holds {mib(size)}, less than {slots} slots need: {mib(need.total(slots, 1))} "
        f"({mib(need.fixed)} fixed, {mib(need.per_worker)} per worker, {mib(need.per_device)} "
        f"per device); the workers beyond {room} will serve unrecorded. Make it larger (docker "
        "run --shm-size, a Kubernetes emptyDir sizeLimit) or lower --set slots=N"
    )


def _pages(size: int, page: int) -> int:
    return -(-size // page) * page
