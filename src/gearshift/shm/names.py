"""Namespaces and the names of their POSIX objects.

Every object of a namespace derives its name from it, so `cleanup` finds all of them:

    /gearshift.<ns>.ctl           control segment: controller identity + worker slot table
    /gearshift.<ns>.lock          semaphore guarding the slot table (/dev/shm/sem.gearshift...)
    /gearshift.<ns>.ring.<slot>   event ring of worker slot <slot>
    /gearshift.<ns>.snap.<dev>    snapshot region of device <dev>
    /gearshift.<ns>.status        the controller's status document (a snapshot region)
    /gearshift.<ns>.streams.<dev> stream ledger of device <dev> (streams.py)

A name parses uniquely from the right (the suffix is `ctl`, `lock`, `status`, `ring.<digits>`,
`snap.<digits>` or `streams.<digits>`), so namespace "a" never claims an object of namespace
"a.ring".
"""

from __future__ import annotations

import re

from gearshift import environment
from gearshift.errors import NamespaceError

MAX_NAMESPACE = 64
_VALID = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_NAMESPACE}}}")


def validate(namespace: str) -> str:
    """Return `namespace` if it is 1..64 characters of [A-Za-z0-9_.-], not `.` or `..` (it also
    names the default state directory); else NamespaceError."""
    if (
        not isinstance(namespace, str)
        or not _VALID.fullmatch(namespace)
        or namespace in (".", "..")
    ):
        raise NamespaceError(
            f"invalid namespace {namespace[:80]!r}: use 1..{MAX_NAMESPACE} characters of "
            "letters, digits, '_', '.', '-' (no '/'), other than '.' and '..'"
            if isinstance(namespace, str)
            else f"invalid namespace: a string is needed, got {type(namespace).__name__}"
        )
    return namespace


def resolve(namespace: str | None = None) -> str:
    """The namespace to use, validated: `namespace` if given, else `GEARSHIFT_NAMESPACE` if set,
    else "default". The worker library and the command line both resolve it here."""
    if namespace is not None:
        return validate(namespace)
    value = environment.read("namespace")
    if value is None:
        return environment.DEFAULT_NAMESPACE
    try:
        return validate(value)
    except NamespaceError as e:
        raise NamespaceError(f"{environment.VARIABLES['namespace']}: {e}") from None


def control(namespace: str) -> str:
    return f"/gearshift.{validate(namespace)}.ctl"


def lock(namespace: str) -> str:
    return f"/gearshift.{validate(namespace)}.lock"


def ring(namespace: str, slot: int) -> str:
    return f"/gearshift.{validate(namespace)}.ring.{_index(slot)}"


def snapshot(namespace: str, device: int) -> str:
    return f"/gearshift.{validate(namespace)}.snap.{_index(device)}"


def streams(namespace: str, device: int) -> str:
    return f"/gearshift.{validate(namespace)}.streams.{_index(device)}"


def status(namespace: str) -> str:
    return f"/gearshift.{validate(namespace)}.status"


def segment_pattern(namespace: str) -> re.Pattern[str]:
    """Matches the /dev/shm entries (no leading '/') of the segments of `namespace`."""
    return re.compile(
        rf"gearshift\.{re.escape(validate(namespace))}"
        r"\.(ctl|status|ring\.\d+|snap\.\d+|streams\.\d+)"
    )


def _index(value: int) -> int:
    if not isinstance(value, int) or value < 0:
        raise NamespaceError(f"slot and device indices are non-negative ints, got {value!r}")
    return value
