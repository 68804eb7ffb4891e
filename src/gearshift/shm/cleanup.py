"""A namespace's end (`cleanup`), and the controller's start (`own`), which must not race it.

`cleanup(namespace)` removes a namespace whose controller and workers are all dead (as its
`Registry` judges them, lease.py: one of another pid namespace is taken for alive until its lease
is seen to expire, so a one-shot cleanup never removes it; `patience` watches that long). Under the
lock it closes the control segment, recording its own identity (`Registry.retire`, refused while
anyone lives: from then on nobody claims a slot or the controller in it); then it removes the
lock, every other segment of the namespace, and the control segment last, each only if it is
this user's and only while it is the object checked (the lock and the control segment by
inode; the others while the checked control segment is still in place). Hence:

- once the lock is gone nobody attaches the closed namespace (attaching needs it);
- a namespace created after the control segment went is a new one (a new control segment,
  then a new lock), and nothing of it is removed;
- a cleanup that died half-way leaves a closed (or lockless) segment: the next cleanup, or
  the next controller's `own`, finishes the removal.

Another user's objects are left in place; `cleanup` removes the rest, then raises NotOwned
naming them.

`leave(namespace)` is a worker's last act, its slot released: the same `cleanup`, whose checks
under the lock leave the namespace in place while its controller or another worker lives; so
the last worker to leave a namespace whose controller is gone removes it.

`own(namespace, slots)` is the controller's start: the namespace's registry, created or taken
over, with this process as its controller (ControllerRunning if another live one is; one of
another pid namespace is watched until a beat shows it alive, or its lease expires: a
takeover). It waits up to the lock timeout for a cleanup under way and finishes one whose
process died.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from gearshift.clock import Clock, MonotonicClock
from gearshift.errors import (
    ControllerNotFound,
    ControllerRunning,
    GearshiftError,
    LayoutError,
    NamespaceBusy,
    NotOwned,
)
from gearshift.shm import lease, liveness, lock, names, segment
from gearshift.shm.control import LOCK_TIMEOUT, Registry
from gearshift.shm.segment import Inode

log = logging.getLogger(__name__)
GRACE = 1.0  # seconds a cleanup under way (a lockless control segment) gets before `own` helps


def cleanup(namespace: str, wait: float | None = None, patience: float = 0.0,
            clock: Clock | None = None) -> list[str]:
    """Remove every segment and the lock of `namespace`; return the segments removed.

    Refuses, removing nothing, while its controller (ControllerRunning) or any worker holding a
    slot (NamespaceBusy) is alive, or the lock stays held by a live process over `wait`
    (default: the lock timeout); a participant of another pid namespace is alive until its
    lease expires within `patience` seconds of watching it (lease.py: give at least LEASE to
    remove a dead one). NotOwned, after removing the rest, if some of its objects belong to
    another user.
    """
    control: Inode | None = None
    lock_inode: Inode | None = None
    try:
        registry = Registry.attach(namespace, relock=True)
    except ControllerNotFound:  # no control segment: leftovers of a half-removed namespace
        registry = None
    except (LayoutError, NotOwned):  # garbage, or another user's: remove what is ours
        registry = None
        control = _inode(names.control(namespace))
    if registry is not None:
        registry.wait = wait
        clock = clock or MonotonicClock()
        registry.clock = clock
        start = clock.now()
        try:
            while True:
                try:
                    _retire(registry, namespace)
                    break
                except (ControllerRunning, NamespaceBusy) as e:
                    if isinstance(e, NotOwned) or clock.now() - start >= patience or not (
                            _leased(registry)):
                        raise
                    clock.sleep(min(0.1, patience))
            control, lock_inode = registry.segment.inode, registry.lock.inode
        finally:
            registry.close()
    removed, left = _remove(namespace, control, lock_inode)
    if left:
        raise NotOwned(
            f"namespace {namespace!r}: {len(removed)} objects removed, {len(left)} left: "
            + "; ".join(left)
        )
    return removed


def _retire(registry: Registry, namespace: str) -> None:
    owner = registry.controller()
    if owner.alive:
        raise ControllerRunning(namespace, owner.pid)
    registry.repair_lock()
    registry.retire()


def _leased(registry: Registry) -> bool:
    """Whether a participant judged alive is of another realm (its lease may yet expire).
    Every participant is looked at, so that all their leases run from the first look (one
    lease's patience removes a dead pod's namespace, not one lease per participant)."""
    owner, slots = registry.controller(), registry.slots()
    if owner.alive:
        return owner.foreign
    return any(info.alive and info.foreign for info in slots)


def leave(namespace: str) -> list[str]:
    """`cleanup(namespace)` if nobody else lives in it (see the module docstring), logged; []
    when it stays for a live controller or worker, or for another user's objects. Never raises
    (a worker's close calls it): another failure is logged and leaves the namespace."""
    try:
        removed = cleanup(namespace)
    except (ControllerRunning, NamespaceBusy):  # NotOwned is a NamespaceBusy
        return []
    except (GearshiftError, OSError) as e:
        log.warning("namespace %r: not removed by its last worker: %s", namespace, e)
        return []
    if removed:
        log.info("namespace %r: no controller, no other worker: removed %d objects", namespace,
                 len(removed))
    return removed


def own(namespace: str, slots: int, clock: Clock | None = None) -> Registry:
    """The registry of `namespace` (created, or taken over from a dead controller) with this
    process as its controller, the lock repaired first; see the module docstring."""
    clock = clock or MonotonicClock()
    start = clock.now()
    while True:
        try:
            registry: Registry | None = Registry.open(namespace, slots)
        except ControllerNotFound:  # gone meanwhile, or lockless: a cleanup is under way
            registry, closer = None, 0
        if registry is not None:
            try:
                registry.repair_lock()
                registry.claim_controller(wait=lease.LEASE + lease.BEAT)
                return registry
            except ControllerNotFound:  # closed by a cleanup
                closer = registry.closed
                registry.close()
            except BaseException:
                registry.close()
                raise
        waited = clock.now() - start
        if (closer and not liveness.alive(closer)) or waited >= GRACE:
            cleanup(namespace)  # finish a removal its process left half-way
        if waited >= LOCK_TIMEOUT:
            raise NamespaceBusy(
                f"namespace {namespace!r} is still being removed after {LOCK_TIMEOUT} s"
            )
        clock.sleep(0.002)


def _remove(
    namespace: str, control: Inode | None, lock_inode: Inode | None
) -> tuple[list[str], list[str]]:
    """(segments removed, objects left with the reason) in the order of the module docstring.
    `control`: the control segment checked (None: there was none); `lock_inode`: the lock
    checked (None: whichever of this user's is there while the control segment is unchanged)."""
    removed: list[str] = []
    left: list[str] = []
    ctl = names.control(namespace)

    def unchanged() -> bool:
        return _inode(ctl) == control

    def attempt(name: str, remove: Callable[[], bool]) -> bool:
        try:
            return remove()
        except NotOwned as e:
            left.append(str(e))
        except OSError as e:
            left.append(f"{name}: {e.strerror or e}")
        return False

    inode = lock_inode or _inode(lock.semaphore_name(namespace))
    if inode is not None and unchanged():  # the lock is not listed among the segments
        attempt(names.lock(namespace), lambda: lock.unlink(namespace, inode))
    pattern = names.segment_pattern(namespace)
    for entry in sorted(os.listdir(segment.SHM_DIR)):
        name = f"/{entry}"
        if (
            pattern.fullmatch(entry)
            and name != ctl
            and unchanged()
            and attempt(name, lambda name=name: segment.unlink(name))
        ):
            removed.append(name)
    if control is not None and attempt(ctl, lambda: segment.unlink(ctl, control)):
        removed.append(ctl)
    return sorted(removed), left


def _inode(name: str) -> Inode | None:
    info = segment.stat_of(name)
    return None if info is None else (info.st_dev, info.st_ino)
