"""Registering a client's profiles with the controller, through its slot's mailbox.

One registration is in flight at a time: `pump` takes the replies waiting, then posts the next
queued profile if none is outstanding. A reply marks its profile `registered` or, a refusal,
sets its `rejected` (`Client.profile` raises it to the caller); `again` (a new controller)
queues every profile not refused once more. Until `bind` gives it a registry and slot (a client
that started before its controller), profiles only queue. A refusal for want of room in
/dev/shm (SpaceError: the controller could not make the device's snapshot region) is no verdict
on the profile: it stays queued, serving on its initial gears, and nothing is posted again for
`retry_interval`. All of it runs under the queue's lock,
on whichever thread pumps: a caller waiting in `Client.profile`, or the swap thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from gearshift import protocol
from gearshift.clock import Clock, MonotonicClock
from gearshift.errors import GearshiftError, GroupError, LayoutError, SpaceError
from gearshift.shm import Registry, mailbox
from gearshift.worker.profile import Profile

log = logging.getLogger(__name__)
NO_GROUPS = ("the controller did not acknowledge its group (it predates groups, "
             "docs/architecture.md \"Tensor parallel\"): upgrade gearshift on it")
REGISTER_POLL = 0.001  # seconds between looks at the reply mailbox while waiting for a reply


class RegistrationQueue:
    """The profiles of one slot, by id, and the queue of those to register, in order. `warn`
    logs a rate-limited warning (the client's); `clock` paces the waits and the retries."""

    def __init__(self, namespace: str, warn: Callable[..., None], clock: Clock | None = None,
                 retry_interval: float = 5.0) -> None:
        self.namespace = namespace
        self.clock = clock or MonotonicClock()
        self.retry_interval = retry_interval
        self._held_until = float("-inf")  # nothing posted before: the controller had no room
        self.registry: Registry | None = None  # until `bind`: profiles only queue
        self.slot = -1
        self._warn = warn
        self._by_id: dict[int, Profile] = {}
        self._queue: list[Profile] = []  # to register, in order
        self._outstanding: Profile | None = None  # posted, no reply yet
        self._lock = threading.Lock()

    def add(self, prof: Profile) -> None:
        """Queue `prof` for registration (`pump` posts it)."""
        with self._lock:
            self._by_id[prof.id] = prof
            self._queue.append(prof)

    def bind(self, registry: Registry, slot: int) -> None:
        """Register through `slot` of `registry` from now on (the client has claimed it)."""
        with self._lock:
            self.registry, self.slot, self._outstanding = registry, slot, None

    def forget(self, prof: Profile) -> None:
        """Ignore replies about `prof` from now on (its registration was refused)."""
        with self._lock:
            self._by_id.pop(prof.id, None)

    def pump(self) -> None:
        """Take the replies waiting, then post the next registration if none is in flight."""
        with self._lock:
            registry, slot = self.registry, self.slot
            if registry is None:
                return
            try:
                while (reply := registry.replies(slot).take()) is not None:
                    self._on_reply(reply)
                if self._outstanding is None and self._queue and (
                    self.clock.now() >= self._held_until
                ):
                    p = self._queue[0]
                    if registry.requests(slot).post(
                        protocol.register_message(p.id, p.name, p.dims, p.group)
                    ):
                        self._outstanding = self._queue.pop(0)
            except GearshiftError as e:
                self._warn("namespace %r: registration mailbox: %s", self.namespace, e)

    def send(self, message: dict) -> bool:
        """Post `message` (no reply expected) in the request mailbox, under the queue's lock;
        False when unbound or the mailbox is not free yet (send it again later)."""
        with self._lock:
            return self.registry is not None and self.registry.requests(self.slot).post(message)

    def forked(self) -> None:
        """In a forked child: unbound (the slot and its mailboxes are the parent's) until `bind`
        gives it the child's own, with every profile not refused queued again."""
        self._lock = threading.Lock()  # a parent's thread may have held it at the fork
        self.unbind()

    def unbind(self) -> None:
        """Unbound (the slot is gone: the client re-attaches) until `bind`, with every profile
        not refused queued again."""
        with self._lock:
            self.registry, self.slot, self._held_until = None, -1, float("-inf")
        self.again()

    def wait(self, prof: Profile, timeout: float) -> None:
        """Pump until the controller answers `prof` (`registered`, `rejected` set, or held for
        want of room) or for `timeout`; no answer is logged (it serves on its initial gears)."""
        clock = self.clock
        deadline = clock.now() + timeout
        while True:
            self.pump()
            if prof.rejected is not None or prof.registered or clock.now() < self._held_until:
                return
            if clock.now() >= deadline:
                break
            clock.sleep(REGISTER_POLL)
        if timeout > 0:
            log.warning("profile %r: no registration reply in %.1f s; serving on its initial "
                        "gears until the controller answers", prof.name, timeout)

    def again(self) -> None:
        """Register every profile not refused once more (a new controller knows none)."""
        with self._lock:
            self._outstanding = None
            self._queue = [p for p in self._by_id.values() if p.rejected is None]
            for p in self._queue:
                p.registered = False

    def _on_reply(self, reply: dict) -> None:
        if "error" in reply:
            prof, self._outstanding = self._outstanding, None
            try:
                mailbox.raise_for_error(reply)
            except SpaceError as e:  # no verdict on the profile: registered later
                self._held_until = self.clock.now() + self.retry_interval
                if prof is not None and prof not in self._queue:
                    self._queue.insert(0, prof)
                self._warn("namespace %r: registration of profile %r held: %s; serving on its "
                           "initial gears, trying again every %g s", self.namespace,
                           prof.name if prof else None, e, self.retry_interval)
            except LayoutError as e:  # no verdict on a profile: on this worker's whole ring
                log.error("namespace %r: the controller refuses this worker: %s",
                          self.namespace, e)
                if prof is not None and prof not in self._queue:
                    self._queue.insert(0, prof)
            except GearshiftError as e:
                log.error("registration of profile %r refused: %s", prof.name if prof else None, e)
                if prof is not None:
                    prof.rejected = e
            return
        pid = reply.get("profile")
        prof = self._by_id.get(pid) if isinstance(pid, int) else None
        if prof is None or reply.get("op") != "registered":
            log.warning("namespace %r: unexpected registration reply %r", self.namespace, reply)
            return
        if prof.group is not None and reply.get("group") != prof.group.name:
            log.error("registration of profile %r refused: %s", prof.name, NO_GROUPS)
            prof.rejected = GroupError(f"profile {prof.name!r} of group {prof.group.name!r}: "
                                       f"{NO_GROUPS}")
        else:
            prof.registered = True
        if prof in self._queue:
            self._queue.remove(prof)
        if self._outstanding is prof:
            self._outstanding = None
