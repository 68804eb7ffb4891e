"""Typed exceptions at the library boundary.

Every error a caller can act on is a `GearshiftError`; those caused by bad
input are also `ValueError`s so generic handlers keep working.
"""

from __future__ import annotations


class GearshiftError(Exception):
    """Base class of every error gearshift raises on purpose."""


class ConfigError(GearshiftError, ValueError):
    """A configuration key is unknown or its value is out of range."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


class ShapeError(GearshiftError, ValueError):
    """A request shape is invalid: non-positive, over a bound, or an unknown dim."""


class TraceError(GearshiftError, ValueError):
    """A trace file cannot be read: missing, malformed, or out of order."""


class NamespaceError(GearshiftError, ValueError):
    """A namespace name is invalid."""


class LayoutError(GearshiftError):
    """A shared-memory segment has the wrong magic or a layout version we cannot read."""


class Unsealed(LayoutError):
    """A shared-memory segment whose creator has not written its header (yet): retry later."""


class NamespaceBusy(GearshiftError):
    """A shared-memory object is held by a live process (no free worker slot, live workers at
    cleanup, an undrained ring, an existing segment), or its lock is held past the timeout."""


class NotOwned(NamespaceBusy):
    """A shared-memory object of the namespace belongs to another user or lets other users
    in (mode bits beyond 0600): it is never attached, written or removed."""


class SpaceError(GearshiftError):
    """A shared-memory segment cannot be reserved: /dev/shm (a tmpfs) has no room for it."""


class NamespaceLost(GearshiftError):
    """The controller's own shared-memory objects were removed or replaced under it (an
    administrator's rm, systemd's RemoveIPC): new workers cannot find it."""


class PayloadError(GearshiftError, ValueError):
    """A snapshot or mailbox payload is oversized or cannot be decoded within limits."""


class ControllerNotFound(GearshiftError):
    """No live controller serves the namespace."""


class ControllerRunning(GearshiftError):
    """Another live controller already owns the namespace."""

    def __init__(self, namespace: str, pid: int) -> None:
        super().__init__(f"namespace {namespace!r} is owned by a live controller, pid {pid}")
        self.namespace = namespace
        self.pid = pid


class ProfileMismatch(GearshiftError, ValueError):
    """A profile registered under an existing name on the same device differs from it."""


class StateError(GearshiftError):
    """The controller's state file is corrupt or of a newer format."""


class UnsafeStateDir(GearshiftError):
    """The state directory, or a file in it, is a symlink, belongs to another user or lets
    other users write: nothing in it is opened, written or set aside."""


class BackendUnavailable(GearshiftError):
    """A graph backend (cuda, npu) is not usable in this process."""


class PaddingError(ShapeError):
    """A function whose result would change with the padding gearshift adds (it reduces or
    selects over a padded axis, or mixes padded rows into real ones): refused, with the fix."""


class GroupError(GearshiftError, ValueError):
    """A group of ranks is declared wrongly, or a rank is told to replay a gear it does not
    hold (docs/architecture.md, "Tensor parallel")."""
