"""The loop's upkeep of its namespace: a dead holder's lock released, and the controller's own
shared-memory objects checked by inode.

An administrator's `rm` or systemd's RemoveIPC unlinks names under a running controller: new
workers then find no namespace (or a new one) while it serves the old objects. `check` compares
each name with the object this controller opened: a lost control segment or lock raises
NamespaceLost (the controller stops, so that no second controller serves the namespace beside
it unseen); a lost snapshot region is closed and dropped, for the caller to create and publish
again.
"""

from __future__ import annotations

import logging

from gearshift.clock import Clock
from gearshift.errors import NamespaceLost
from gearshift.shm import Registry, SnapshotRegion, lock, segment

log = logging.getLogger(__name__)


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
