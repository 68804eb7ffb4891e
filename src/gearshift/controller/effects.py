"""Effects: what the controller's parts ask of it, as small frozen values.

`Slots` and `Registrations` change only their own state; what must happen beyond it they return
as a list of effects, which the controller matches and applies in order (`Controller._apply`). A
registration's list puts its publish and save before its reply: the worker maps the snapshot
when it reads the reply, and a successor inherits the worker's ids from the status document.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gearshift.core.round import ProfileLedger


@dataclass(frozen=True)
class Failed:
    """A part's handling failed: count it and log it (at most every 10 s per `what`)."""

    what: str
    error: Exception


@dataclass(frozen=True)
class Inherit:
    """A new claim of `slot`: map the profile ids the previous controller's status lists for
    it, before its ring is read."""

    slot: int


@dataclass(frozen=True)
class Measured:
    """Drained records of `slot` and their global profile keys, for the cost book."""

    slot: int
    events: np.ndarray
    keys: np.ndarray


@dataclass(frozen=True)
class Reclaim:
    """`slot`'s worker is gone: answer the registration it left pending, then drain its ring to
    the end, free the slot and unlink the ring (`Slots.reclaim`)."""

    slot: int


@dataclass(frozen=True)
class Added:
    """Profile `name` added to `device`'s ledger for `slot`'s registration; kept only if the
    snapshot publishes, else `previous` (None: no such profile) is put back."""

    slot: int
    device: int
    name: str
    previous: ProfileLedger | None


@dataclass(frozen=True)
class Publish:
    """Publish `device`'s snapshot. Where it publishes a profile `added`, its failure withdraws
    the profile, refuses the registration and drops the rest of the list."""

    device: int
    added: Added | None = None


@dataclass(frozen=True)
class ForgetCosts:
    """Forget what was measured of profile `name` on `device` (declared anew)."""

    device: int
    name: str


@dataclass(frozen=True)
class Save:
    """Save the state file now, on the loop."""


@dataclass(frozen=True)
class Map:
    """Map `slot`'s worker's profile id `local` to profile `name` of `device`."""

    slot: int
    local: int
    device: int
    name: str


@dataclass(frozen=True)
class PublishStatus:
    """Publish the status document now."""


@dataclass(frozen=True)
class Log:
    """Log `message % args` at INFO on `logger`."""

    logger: str
    message: str
    args: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Reply:
    """Post `message` in `slot`'s reply mailbox; with `version_of`, that device's snapshot
    version (as it is when the reply is posted) added as "version"."""

    slot: int
    message: dict[str, Any]
    version_of: int | None = None


Effect = (Failed | Inherit | Measured | Reclaim | Publish | ForgetCosts | Save | Map | PublishStatus
          | Log | Reply)
