"""What the control segment's slot table reads as (`control.py` has the layout): a slot's
row judged (`judge`) into a `SlotInfo`, and the controller's identity as a `ControllerInfo`.

Nothing read is trusted: a state word that is not a SlotState, or a claimed slot's device
beyond MAX_DEVICE, reads as CORRUPT. An ACTIVE slot is `alive` by the judge of lease.py: its
identity (pid and start time) where its realm is the reader's, else its lease (`foreign`: its
beats watched by the reader's `Watch`, dead after LEASE seconds without one).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from gearshift.shm import liveness
from gearshift.shm.lease import Watch

MAX_DEVICE = 0xFFFF  # devices are 0..MAX_DEVICE
TIME_NS = (1 << 32) - 1  # a realm's time-namespace part (liveness.realm)


class SlotState(enum.IntEnum):
    FREE = 0
    ACTIVE = 1  # claimed by a worker (alive or not: see SlotInfo.alive)
    RELEASED = 2  # its worker detached; the ring awaits its final drain
    CORRUPT = -1  # never stored: a state or device word no process of ours writes (skipped)


class SlotInfo(NamedTuple):
    slot: int
    state: SlotState
    pid: int
    alive: bool
    device: int
    generation: int
    heartbeat_ns: int
    applied_version: int
    dropped: int
    foreign: bool = False  # claimed from another realm (pid or time namespace): leased
    clock_shared: bool = True  # its time namespace is the reader's: its monotonic times read

    @property
    def reclaimable(self) -> bool:
        """Its worker is gone: drain the ring, then `Registry.reclaim`."""
        return self.state == SlotState.RELEASED or (
            self.state == SlotState.ACTIVE and not self.alive
        )


class ControllerInfo(NamedTuple):
    pid: int  # 0: none ever claimed, or released
    alive: bool
    heartbeat_ns: int
    ident: int = 0  # its identity (liveness.py), as recorded
    foreign: bool = False  # of another realm: judged by its lease, not signalled from here


def is_alive(ident: int, realm: int, key: object, beats: int, watch: Watch, now: float) -> bool:
    """The judge of lease.py: `ident`'s identity check if `realm` is this process's, else
    whether its (identity, beats) changed within the lease, as `watch` saw it under `key`."""
    if ident == 0:
        return False
    if realm == liveness.realm():
        return liveness.alive(ident)
    return not watch.expired(key, (ident, beats), now)


def judge(slot: int, row: tuple[int, ...], watch: Watch, now: float) -> SlotInfo:
    """Slot `slot` from its words (state, ident, device, generation, heartbeat, applied,
    dropped, realm, beats), as read under the lock; `watch` and `now` judge a lease."""
    word, ident, device, generation, heartbeat, applied, dropped, realm, beats = row
    try:
        state = SlotState(word)
    except ValueError:
        state = SlotState.CORRUPT
    if state != SlotState.FREE and device > MAX_DEVICE:
        state = SlotState.CORRUPT
    foreign = state == SlotState.ACTIVE and realm != liveness.realm()
    alive = state == SlotState.ACTIVE and is_alive(
        ident, realm, (slot, generation), beats, watch, now)
    pid = liveness.pid_of(ident)
    shared = (realm ^ liveness.realm()) & TIME_NS == 0
    return SlotInfo(
        slot, state, pid, alive, device, generation, heartbeat, applied, dropped, foreign, shared
    )
