"""The loop's upkeep of its namespace: the controller's identity held (`Leadership`), a dead
holder's lock released, the controller's own shared-memory objects checked by inode, and the
namespace removed at a stop if no live worker holds a slot.

An administrator's `rm` or systemd's RemoveIPC unlinks names under a running controller: new
workers then find no namespace (or a new one) while it serves the old objects. `check` compares
each name with the object this controller opened: a lost control segment or lock raises
NamespaceLost (the controller stops, so that no second controller serves the namespace beside
it unseen); a lost snapshot region is closed and dropped, for the caller to create and publish
again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gearshift.clock import Clock
from gearshift.errors import (
    ControllerRunning,
    GearshiftError,
    NamespaceBusy,
    NamespaceLost,
    NotOwned,
)
from gearshift.shm import Registry, SnapshotRegion, cleanup, lock, segment

log = logging.getLogger(__name__)


class Leadership:
    """The controller word of `registry` kept naming this process, its lease beaten, and the
    namespace lock released when its holder died holding it (counted in `lock_repairs`)."""

    def __init__(self, registry: Registry, clock: Clock,
                 failed: Callable[[str, Exception], None]) -> None:
        self.registry, self.clock, self._failed = registry, clock, failed
        self.lock_repairs = 0  # locks released after their holder died holding them
        self._usurper: tuple[int, int] | None = None  # (identity, beats) of a word not ours

    def repair_lock(self) -> None:
        """`repair_lock`, counted."""
        self.lock_repairs += repair_lock(self.registry, self.clock)

    def hold(self, now: float) -> None:
        """Beat the lease at `now` if the word names this process, after `_taken_over` where
        it does not (never beats another's lease)."""
        if not self.registry.owns_controller():
            self._taken_over()
        if self.registry.owns_controller():
            self.registry.beat_controller(int(now * 1e9))

    def _taken_over(self) -> None:
        """The controller word no longer names this process: claim it back if it is free, names
        a dead process of this realm, or one of another realm whose lease expired while this one
        watched; another controller, beating, took over (it judged this one dead: a stop longer
        than the lease): NamespaceLost, this one stops."""
        try:
            self.registry.claim_controller()
            self._usurper = None
        except ControllerRunning as e:
            seen = (self.registry.controller().ident, self.registry.controller_beats())
            if self._usurper is None or self._usurper == seen:  # no beat seen yet: a word
                self._usurper = self._usurper or seen  # a buggy process wrote is claimed back
                return  # once its lease expired; a controller beating takes over
            raise NamespaceLost(f"namespace {self.registry.namespace!r}: {e}; another "
                                "controller took the namespace over (this one was judged dead: "
                                "stopped or stalled past the lease), so this one stops") from None
        except GearshiftError as e:  # the lock busy, the namespace closed: next iteration
            self._failed("controller identity", e)


def repair_lock(registry: Registry, clock: Clock) -> bool:
    """Release the namespace lock if its holder died holding it, without waiting (an
    unrecorded holder is judged over later calls); logged."""
    if not registry.repair_lock(clock, wait=False):
        return False
    log.warning("namespace %r: the lock, held by a dead process, was released",
                registry.namespace)
    return True


def check(registry: Registry, regions: dict[object, SnapshotRegion]) -> list[object]:
    """NamespaceLost if `registry`'s control segment or lock lost its name; the keys of the
    `regions` that lost theirs (closed and removed from `regions`)."""
    lock_file = lock.semaphore_name(registry.namespace)
    info = segment.stat_of(lock_file)
    lost = [registry.segment.name] if registry.segment.displaced() else []
    if info is None or (info.st_dev, info.st_ino) != registry.lock.inode:
        lost.append(lock_file)
    if lost:
        raise NamespaceLost(
            f"namespace {registry.namespace!r}: {', '.join(map(segment.path, lost))} removed "
            "or replaced under its controller (an administrator's rm, or systemd's "
            "RemoveIPC=yes: set RemoveIPC=no); new workers cannot find it, so this controller "
            "stops: start it again to re-create the namespace")
    gone = [key for key, region in regions.items() if region.segment.displaced()]
    for key in gone:
        log.error("%s was removed under the controller: created again",
                  regions[key].segment.name)
        regions.pop(key).close()
    return gone


def remove_namespace(namespace: str, level: int = logging.INFO) -> None:
    """Remove the namespace unless a live worker holds a slot (`cleanup` checks that under the
    namespace lock); what happened is logged at `level`, another user's object as a warning."""
    try:
        removed = cleanup(namespace, wait=1.0)  # a stopped lock holder delays a stop 1 s at most
        log.log(level, "no live worker: namespace %r removed (%d objects)", namespace,
                len(removed))
    except NotOwned as e:
        log.warning("%s", e)
    except NamespaceBusy as e:  # a live worker (its message names the namespace)
        log.log(level, "%s: the namespace stays for it; the last worker to leave removes it", e)
    except ControllerRunning as e:
        log.log(level, "%s: the namespace stays", e)
