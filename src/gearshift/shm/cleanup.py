"""Removal of a dead namespace's shared-memory objects (`gearshift cleanup`)."""

from __future__ import annotations

import os

from gearshift.errors import ControllerNotFound, ControllerRunning
from gearshift.shm import names, segment
from gearshift.shm.control import Registry, unlink_lock


def cleanup(namespace: str) -> list[str]:
    """Unlink every segment and the lock of `namespace`; return the names removed.

    Refuses, removing nothing, while its controller (ControllerRunning) or any worker holding a
    slot (NamespaceBusy) is alive. The registry is marked closed under its lock first, so a
    worker that attached it meanwhile cannot claim a slot in the unlinked segment.
    """
    try:
        registry = Registry.attach(namespace)
    except ControllerNotFound:
        registry = None  # no registry: leftovers of a half-created or half-cleaned namespace
    if registry is not None:
        try:
            owner = registry.controller()
            if owner.alive:
                raise ControllerRunning(namespace, owner.pid)
            registry.repair_lock()
            registry.retire()
        finally:
            registry.close()
    pattern = names.segment_pattern(namespace)
    found = sorted(f"/{entry}" for entry in os.listdir(segment.SHM_DIR) if pattern.fullmatch(entry))
    removed = [name for name in found if segment.unlink(name)]
    unlink_lock(namespace)
    return removed
