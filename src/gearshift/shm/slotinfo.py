"""What the control segment's slot table reads as (`control.py` has the layout): a slot's
row judged (`judge`) into a `SlotInfo`, and the controller's identity as a `ControllerInfo`.

Nothing read is trusted: a state word that is not a SlotState, or a claimed slot's device
beyond MAX_DEVICE, reads as CORRUPT; an ACTIVE slot claimed from another pid namespace reads as
`foreign` (its identity means nothing here: never alive, never reclaimable); otherwise `alive`
is the identity check of liveness.py (pid and start time).
"""

from __future__ import annotations

import enum
from typing import NamedTuple

from gearshift.shm import liveness

MAX_DEVICE = 0xFFFF  # devices are 0..MAX_DEVICE


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
    foreign: bool = False  # ACTIVE, claimed from another pid namespace: liveness unknown here

    @property
    def reclaimable(self) -> bool:
        """Its worker is gone: drain the ring, then `Registry.reclaim`."""
        return self.state == SlotState.RELEASED or (
            self.state == SlotState.ACTIVE and not self.alive and not self.foreign
        )


class ControllerInfo(NamedTuple):
    pid: int  # 0: none ever claimed, or released
    alive: bool
    heartbeat_ns: int
    ident: int = 0  # its identity (liveness.py), as recorded


def judge(slot: int, row: tuple[int, ...]) -> SlotInfo:
    """Slot `slot` from its words (state, ident, device, generation, heartbeat, applied,
    dropped, pidns), as read under the lock."""
    word, ident, device, generation, heartbeat, applied, dropped, pidns = row
    try:
        state = SlotState(word)
    except ValueError:
        state = SlotState.CORRUPT
    if state != SlotState.FREE and device > MAX_DEVICE:
        state = SlotState.CORRUPT
    foreign = state == SlotState.ACTIVE and pidns not in (0, liveness.pid_namespace())
    alive = state == SlotState.ACTIVE and not foreign and liveness.alive(ident)
    pid = liveness.pid_of(ident)
    return SlotInfo(
        slot, state, pid, alive, device, generation, heartbeat, applied, dropped, foreign
    )
