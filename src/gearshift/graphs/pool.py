"""Graph lifetime: one opaque key per graph resource of a device.

`register` keeps a resource and returns its key, which its owner keeps beside the graph (the
adaptive runner: in the graph's `Captured` (`graphs.capturing`), the one structure that tracks it).
`remove_by_keys` is idempotent: a key given twice is released once; it resets the graphs after
a device synchronize, then gives their memory back to the device once
(`Backend.collect`), all outside any capture (`device.GUARD`). A device may cap its
graphs (`max_graphs`, npu): `admit` raises GraphLimit, with the backend's reason, once
the pool holds that many or the device refused a capture for want of streams (`full`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any, ClassVar

from gearshift.graphs.backends import Backend, get_backend
from gearshift.graphs.device import GUARD, GraphLimit

__all__ = ["GraphLimit", "GraphResourcePool"]


class GraphResourcePool:
    """Graph resources of one device, by int key. One pool per device: `get_pool`.
    `max_graphs`: at most this many resources (default: the backend's cap; None: no cap)."""

    _pools: ClassVar[dict[tuple[str, int], GraphResourcePool]] = {}
    _pools_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, backend: Backend, max_graphs: int | None = -1) -> None:
        self.backend = backend
        self.max_graphs = getattr(backend, "max_graphs", None) if max_graphs == -1 else max_graphs
        self._lock = threading.Lock()
        self._next_key = 0
        self._entries: dict[int, Any] = {}

    @classmethod
    def get_pool(cls, device_index: int, backend: str = "cpu") -> GraphResourcePool:
        """The process-wide pool of device `device_index` of the `backend` kind."""
        with cls._pools_lock:
            key = (backend, device_index)
            if key not in cls._pools:
                cls._pools[key] = cls(get_backend(backend, device_index))
            return cls._pools[key]

    def admit(self, more: int = 1) -> None:
        """Raise GraphLimit unless `more` resources fit under `max_graphs`."""
        cap, b = self.max_graphs, self.backend
        if getattr(b, "full", False):
            raise GraphLimit(f"{b.kind}:{b.index} refused a capture for want of streams, with"
                             f" {len(self._entries)} graphs here: none is tried until a release")
        if cap is not None and len(self._entries) + more > cap:
            reason = getattr(b, "limit_reason", "") or "the pool's max_graphs"
            raise GraphLimit(
                f"{b.kind}:{b.index} holds {len(self._entries)} graphs, its cap being {cap}:"
                f" {reason}"
            )

    def room(self) -> tuple[int | None, str]:
        """How many more graphs the pool may hold (None: no cap), and why it is capped: its
        cap, or fewer where the device's processes share its streams (`shared_room`)."""
        cap, b = self.max_graphs, self.backend
        why = getattr(b, "limit_reason", "") or "the pool's max_graphs"
        free = None if cap is None else max(cap - len(self), 0)
        shared = getattr(b, "shared_room", None)
        more = shared() if shared is not None else None
        if more is not None and (free is None or more < free):
            return more, f"the device's processes hold its streams; {why}"
        return free, why

    def register(self, resource: Any) -> int:
        """Keep `resource` (has `release()` or `reset()`); returns its new key."""
        with self._lock:
            key = self._next_key
            self._next_key += 1
            self._entries[key] = resource
        return key

    def remove_by_keys(self, keys: Iterable[int]) -> int:
        """Release the resources still held under `keys` (unknown keys are skipped) after a
        device synchronize, then give their memory back (`Backend.collect`, once); returns
        how many were released."""
        with self._lock:
            found = [r for r in (self._entries.pop(k, None) for k in keys) if r is not None]
        if not found:
            return 0
        released = len(found)
        with GUARD.shared():  # no capture underway meanwhile: the sync would void it
            self.backend.synchronize()
            for i in range(released):  # no reference is left here to a graph at the collect
                resource, found[i] = found[i], None
                (getattr(resource, "release", None) or resource.reset)()
            del resource
            self.backend.collect()
        return released

    def __len__(self) -> int:
        return len(self._entries)

