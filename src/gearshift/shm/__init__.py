"""Shared memory between workers and the controller of one node; no torch here.

- `EventRing`: one SPSC ring of fixed 64-byte records per worker slot (worker -> controller).
- `SnapshotRegion`: one seqlocked, double-buffered msgpack snapshot per device (controller ->
  workers).
- `Registry`: the control segment: controller identity, worker slots, per-slot mailboxes.
- `StreamLedger` (`shm.streams`): the device streams each worker's graphs hold, per device.
- `cleanup`: removes a namespace whose controller and workers are all dead.
"""

from gearshift.shm.cleanup import cleanup
from gearshift.shm.control import Registry, SlotInfo, SlotState
from gearshift.shm.mailbox import Mailbox, error_reply, raise_for_error
from gearshift.shm.ring import EVENT_DTYPE, EventRing, Kind
from gearshift.shm.slotinfo import ControllerInfo
from gearshift.shm.snapshot import Snapshot, SnapshotRegion
from gearshift.shm.streams import StreamLedger

__all__ = [
    "EVENT_DTYPE",
    "ControllerInfo",
    "EventRing",
    "Kind",
    "Mailbox",
    "Registry",
    "SlotInfo",
    "SlotState",
    "Snapshot",
    "SnapshotRegion",
    "StreamLedger",
    "cleanup",
    "error_reply",
    "raise_for_error",
]
