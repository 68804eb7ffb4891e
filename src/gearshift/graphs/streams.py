"""Where device backends count the streams they share with the other processes on their device
(npu: 2,048 streams per device, shared by its processes). No torch and no shared memory here:
`install(opener, owner)` sets `opener(index)`, which opens device `index`'s ledger (`connect()`
installs the one of its namespace, `shm.streams.StreamLedger`, owned by that namespace), and
`release(owner)` removes it once every install by that owner is released (a client's close):
no ledger is opened in a namespace whose clients are gone. `ledger(index)` asks it for a
backend (None: none installed, or it failed, logged once per device). A ledger has `take(n)`
(None if taken, else the streams the others hold), `give(n)`, `held`, `budget` and `total()`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)
NPU_STREAMS = 2048  # per device, shared by every process on it
NPU_SPARE_STREAMS = 128  # kept for the runtime and communication (as vllm-ascend keeps)
NPU_BUDGET = NPU_STREAMS - NPU_SPARE_STREAMS  # what gearshift's graphs on a device may hold

_lock = threading.Lock()
_opener: Callable[[int], Any] | None = None
_owner: tuple[str | None, int] = (None, 0)  # who installed the opener, and how many times
_failed: set[int] = set()


def install(opener: Callable[[int], Any] | None, owner: str | None = None) -> None:
    """Open ledgers with `opener(index)` from now on (None: none), on behalf of `owner`; an
    install by the same owner counts once more, another owner's replaces it."""
    global _opener, _owner
    with _lock:
        same = owner is not None and _owner[0] == owner and _opener is not None
        _opener, _owner = opener, (owner, _owner[1] + 1 if same else 1)
        _failed.clear()


def release(owner: str) -> None:
    """One install by `owner` is over; the last one removes its opener (another owner's
    opener stays)."""
    global _opener, _owner
    with _lock:
        name, count = _owner
        if name != owner or _opener is None:
            return
        _owner = (name, count - 1) if count > 1 else (None, 0)
        if count <= 1:
            _opener = None
            _failed.clear()


def ledger(index: int) -> Any:
    """Device `index`'s ledger from the installed opener; None if there is none or it fails."""
    with _lock:
        opener = _opener
        if opener is None or index in _failed:
            return None
    try:
        return opener(index)
    except Exception as e:
        with _lock:
            _failed.add(index)
        log.warning("device %d: no stream ledger (%s): this process counts only its own graphs",
                    index, e)
        return None
