"""Folding drained ring records into the policy's statistics, vectorised (no per-event Python).

A batch is the records drained from several rings, concatenated, with a parallel array of
global profile keys (`ProfileKeys`: each record's worker-local profile id mapped through its
worker's registrations; -1 when that id is not registered). SHAPE, EAGER and RECORDED records
are samples of their profile's dims (an eager or only recorded run is still a request of that
size); MEMORY records are device memory readings; MEASURED and BUFFERS records are the cost
book's (`costbook.CostBook.take`), not samples. `Batch` holds drained records until `limit` of them
are waiting and counts what it consumed and folded (the status document's event counters).

Times are the controller's: `Slots.take` dates each worker's records in the controller's clock
first (`dated`). A sample dated outside the sane window [now - MAX_AGE, now + MAX_AHEAD] (a
worker's clock that is not the controller's and was not corrected: a time namespace, CRIU) is
counted `misdated` (and `invalid`), never folded, and `Batch` warns about it (at most every
WARN_SECONDS); one a little ahead is folded at `now`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import NamedTuple

import numpy as np

from gearshift.core.config import MAX_BYTES
from gearshift.core.round import DeviceLedger, ProfileLedger
from gearshift.shm import Kind

log = logging.getLogger(__name__)
MAX_AGE = 86400.0  # seconds: a sample older than this (controller's clock) is misdated
MAX_AHEAD = 300.0  # seconds: a sample further ahead of `now` is misdated (nearer: folded at now)
WARN_SECONDS = 60.0  # the least time between two warnings about misdated samples


class FoldCounts(NamedTuple):
    folded: int  # samples folded into statistics
    unknown: int  # samples of a profile id no registration maps
    invalid: int  # samples outside their dims' bounds or of another arity; records of no kind;
    # misdated samples
    misdated: int = 0  # samples dated outside the sane window (counted in `invalid` too)


def dated(events: np.ndarray, offset: float | None, now: float) -> np.ndarray:
    """`events` with their times in the controller's clock: shifted by `offset` seconds (the
    worker's clock + offset = the controller's), or stamped `now` (None: not known yet)."""
    if offset == 0.0 or not len(events):
        return events
    events = events.copy()
    if offset is None:
        events["t_ns"] = int(now * 1e9)
    else:
        events["t_ns"] += int(offset * 1e9)
    return events


def fold(
    events: np.ndarray, keys: np.ndarray, profiles: Sequence[ProfileLedger | None], now: float
) -> FoldCounts:
    """Fold the samples of `events` (EVENT_DTYPE) into the DimStats of `profiles[key]`
    (each feeds its history).

    A record's time is its t_ns in seconds, in the controller's clock (`dated`), capped at
    `now`; one outside the sane window (module docstring) is counted misdated, and values
    outside a dim's [min, max] are counted, neither folded. Cost: a few numpy passes over the
    batch plus one `DimStats.fold` per profile dim.
    """
    kind = events["kind"].copy()  # one pass over the records; then compact arrays only
    is_sample = (kind == Kind.SHAPE) | (kind == Kind.EAGER) | (kind == Kind.RECORDED)
    samples = int(np.count_nonzero(is_sample))
    odd = len(kind) - samples - int(np.count_nonzero(
        (kind == Kind.MEMORY) | (kind == Kind.MEASURED) | (kind == Kind.BUFFERS)))
    take = is_sample & (keys >= 0)
    unknown = samples - int(np.count_nonzero(take))
    raw = events["t_ns"] * 1e-9
    sane = (raw >= now - MAX_AGE) & (raw <= now + MAX_AHEAD)
    misdated = int(np.count_nonzero(take & ~sane))
    take &= sane
    if not take.all():
        events, keys = events[take], keys[take]
    if not len(keys):
        return FoldCounts(0, unknown, odd + misdated, misdated)
    times = np.minimum(events["t_ns"] * 1e-9, now)
    values, ndim = events["values"], events["ndim"]
    folded = invalid = 0
    for key, rows in _groups(keys):
        count = len(keys) if isinstance(rows, slice) else len(rows)
        profile = profiles[key]
        if profile is None:
            unknown += count
            continue
        done = _fold_profile(profile, times[rows], values[rows], ndim[rows])
        folded += done
        invalid += count - done
    return FoldCounts(folded, unknown, odd + invalid + misdated, misdated)


class ProfileKeys:
    """Global profile keys: each (device, profile name) gets the next integer the first time it
    is seen and keeps it while the controller runs (keys are never reused)."""

    def __init__(self) -> None:
        self.key_by_profile: dict[tuple[int, str], int] = {}
        self.profile_by_key: list[tuple[int, str]] = []

    def key(self, device: int, name: str) -> int:
        """The key of `name` on `device`, given now if it has none yet."""
        key = self.key_by_profile.get((device, name))
        if key is None:
            key = self.key_by_profile[device, name] = len(self.profile_by_key)
            self.profile_by_key.append((device, name))
        return key

    def profile(self, devices: Mapping[int, DeviceLedger],
                key: int) -> tuple[int, str, ProfileLedger | None]:
        """(device, name, ledger) of `key` (the ledger None: the device dropped the profile)."""
        device, name = self.profile_by_key[key]
        return device, name, devices.get(device, DeviceLedger()).profiles.get(name)

    def ledgers(self, devices: Mapping[int, DeviceLedger]) -> list[ProfileLedger | None]:
        """The ledger of each key, in key order (None: the device dropped that profile)."""
        return [devices[d].profiles.get(n) for d, n in self.profile_by_key]


class Batch:
    """Records drained from several rings, folded together once `limit` of them wait (or on
    `flush`) into `ledgers()`, the profile ledgers indexed by global key."""

    def __init__(self, limit: int, ledgers: Callable[[], Sequence[ProfileLedger | None]]) -> None:
        self.limit = limit
        self.ledgers = ledgers
        self.counts = dict.fromkeys(("consumed", *FoldCounts._fields), 0)
        self._parts: list[tuple[np.ndarray, np.ndarray]] = []
        self._held = 0
        self._warned = -float("inf")

    def add(self, events: np.ndarray, keys: np.ndarray, now: float) -> None:
        """Hold `events` with their global profile `keys`; fold the batch once it is full."""
        if not len(events):
            return
        self.counts["consumed"] += len(events)
        self._parts.append((events, keys))
        self._held += len(events)
        if self._held >= self.limit:
            self.flush(now)

    def flush(self, now: float) -> None:
        """Fold every record held and count the outcome."""
        if not self._parts:
            return
        parts, self._parts, self._held = self._parts, [], 0
        events, keys = (
            parts[0] if len(parts) == 1 else map(np.concatenate, zip(*parts, strict=True))
        )
        counts = fold(events, keys, self.ledgers(), now)
        for name in counts._fields:
            self.counts[name] += getattr(counts, name)
        if counts.misdated and now - self._warned >= WARN_SECONDS:
            self._warned = now
            log.warning(
                "%d samples dated outside [now - %g s, now + %g s] of the controller's clock "
                "counted invalid (%d so far): a worker's clock that is not the controller's "
                "(a time namespace?)", counts.misdated, MAX_AGE, MAX_AHEAD,
                self.counts["misdated"])


def _groups(keys: np.ndarray) -> Iterator[tuple[int, slice | np.ndarray]]:
    """(key, rows of that key) for each distinct key; one slice when all keys are equal."""
    first = keys[0]
    if (keys == first).all():
        yield int(first), slice(None)
        return
    order = np.argsort(keys, kind="stable")
    for rows in np.split(order, np.flatnonzero(np.diff(keys[order])) + 1):
        yield int(keys[rows[0]]), rows


def _fold_profile(
    profile: ProfileLedger, times: np.ndarray, values: np.ndarray, ndim: np.ndarray
) -> int:
    """Fold the in-bounds samples into each dim's statistics; returns how many were folded."""
    dims = profile.dims
    v = values[:, : len(dims)]
    low = np.array([d.min for d in dims.values()])
    high = np.array([d.max for d in dims.values()])
    ok = (ndim == len(dims)) & ((v >= low) & (v <= high)).all(axis=1)
    if not ok.all():
        times, v = times[ok], v[ok]
    for column, name in enumerate(dims):
        profile.stats[name].fold(times, v[:, column])  # and its history
    return len(times)


def memory_reading(events: np.ndarray) -> tuple[float, float, float] | None:
    """(time in seconds, used share of device memory, the device's bytes) of the last valid
    MEMORY record (0 < total <= MAX_BYTES, 0 <= free <= total), or None."""
    readings = events[events["kind"] == Kind.MEMORY]
    free, total = readings["values"][:, 0], readings["values"][:, 1]
    rows = np.flatnonzero((total > 0) & (total <= MAX_BYTES) & (free >= 0)
                          & (free <= total))
    if not len(rows):
        return None
    last = rows[-1]
    return (float(readings["t_ns"][last]) * 1e-9, 1.0 - float(free[last]) / float(total[last]),
            float(total[last]))
