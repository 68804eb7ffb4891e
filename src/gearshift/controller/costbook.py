"""The cost book: what the workers measured of the graphs they captured, per (device, profile,
dim), and the fits the policy prices its moves with.

`take` reads the MEASURED records of one drained ring (`shm.ring`: one per dim of each graph a
worker's swap thread captured) and trusts none of them: the profile id goes through the
worker's registrations (unmapped: counted `unknown`); the dim's index, the gear within the dim's
bounds, and seconds and bytes within `core.costs.Measurement`'s bounds are checked (else
`invalid`); a gear the profile does not know (not among its gears, those it evicted lately or
the dim's initial ones) is `unknown`; past MAX_TAKE records of one drain the rest are `invalid`
(a flood). Checks are numpy passes; only the records kept cost Python. BUFFERS records (the
static input buffers a profile's graphs share on a worker) are checked alike (the dim's index,
its gear within the dim's bounds, 0 <= bytes on the dim <= bytes <= MAX_GRAPH_BYTES, the
reserved value 0; else `invalid`); per dim the last valid one of a drain is kept, as the Line
`core.costs.buffer_line` makes of it, and priced with the dim (`Prices.buffers`). They are not
saved: a worker sends them again every few seconds.

Memory is bounded whatever the workers send: per dim, the last PER_GEAR measurements of each
of the MAX_GEARS gears measured last. `costs` fits each dim (`core.costs.fit`, cached until it
is measured again), `prices` gives the policy's `Prices` (`core.costs.prices_for`), `view` the
status document's figures, and `state` / `from_state` the state file's rows: per dim,
[gear, capture seconds, graph bytes, replay seconds], oldest first.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from gearshift.core.costs import (
    MAX_GRAPH_BYTES,
    MAX_MEASURED_SECONDS,
    Curve,
    DimCosts,
    Line,
    Measurement,
    Prices,
    buffer_line,
    fit,
    prices_for,
)
from gearshift.core.dims import MAX_DIMS, Dim
from gearshift.core.round import ProfileLedger
from gearshift.errors import ShapeError, StateError
from gearshift.shm import Kind

PER_GEAR = 8  # measurements kept per gear: the latest
MAX_GEARS = 128  # gears kept per dim: those measured last
MAX_TAKE = 4096  # measurements kept from one drain of one ring; the rest are a flood
VIEW_GEARS = 64  # gears a dim's view shows (those measured last): the status document's size
MAX_NS = int(MAX_MEASURED_SECONDS * 1e9)
Profile = tuple[int, str]  # (device, profile name)
ProfileOf = Callable[[int], tuple[int, str, ProfileLedger | None]]  # global key -> its profile


class CostBook:
    """Measurements per (device, profile) and dim, bounded; `counts`: records kept
    (`measured`), of no known profile or gear (`unknown`), malformed (`invalid`)."""

    def __init__(self) -> None:
        self._book: dict[Profile, dict[str, OrderedDict[int, deque[Measurement]]]] = {}
        self._fits: dict[Profile, dict[str, DimCosts]] = {}
        self._buffers: dict[Profile, dict[str, Line]] = {}  # per dim, the last report's Line
        self.counts = {"measured": 0, "unknown": 0, "invalid": 0}
        self.buffer_reports = 0  # BUFFERS records kept

    def add(self, device: int, profile: str, dim: str, m: Measurement) -> None:
        """Keep `m`, the latest of its gear; the oldest beyond the bounds go."""
        gears = self._book.setdefault((device, profile), {}).setdefault(dim, OrderedDict())
        kept = gears.pop(m.gear, None) or deque(maxlen=PER_GEAR)
        kept.append(m)
        gears[m.gear] = kept  # last: the gear measured most recently
        while len(gears) > MAX_GEARS:
            gears.popitem(last=False)
        self._fits.get((device, profile), {}).pop(dim, None)

    def forget(self, device: int, profile: str) -> None:
        """Drop a profile's measurements (it was declared anew: its dims may differ)."""
        self._book.pop((device, profile), None)
        self._fits.pop((device, profile), None)
        self._buffers.pop((device, profile), None)

    def buffers(self, device: int, profile: str) -> dict[str, Line]:
        """Per dim, the profile's static buffers on one worker as its last report's Line."""
        return dict(self._buffers.get((device, profile), {}))

    def measurements(self, device: int, profile: str) -> dict[str, list[Measurement]]:
        """Per dim, the measurements kept, gear by gear (least recently measured first)."""
        return {d: [m for kept in gears.values() for m in kept]
                for d, gears in self._book.get((device, profile), {}).items()}

    def costs(self, device: int, profile: str) -> dict[str, DimCosts]:
        """Per measured dim, its fitted costs (cached until it is measured again)."""
        fits = self._fits.setdefault((device, profile), {})
        for dim, gears in self._book.get((device, profile), {}).items():
            if dim not in fits:
                fits[dim] = fit(m for kept in gears.values() for m in kept)
        return dict(fits)

    def prices(self, device: int, profile: str, workers: int) -> dict[str, Prices]:
        """What plan mode prices the profile's dims with, for `workers` on the device that
        capture each gear; only dims with a replay curve (`core.costs.prices_for`)."""
        costs = self.costs(device, profile)
        return prices_for(costs, workers, buffers=self.buffers(device, profile)) if costs else {}

    def take(self, events: np.ndarray, keys: np.ndarray, profile_of: ProfileOf) -> None:
        """Check and keep the MEASURED and BUFFERS records among `events` (EVENT_DTYPE, one
        drained ring), whose global profile `keys` (-1: unknown) give their profile
        (`profile_of`)."""
        kind = events["kind"]
        rows = np.flatnonzero((kind == Kind.MEASURED) | (kind == Kind.BUFFERS))
        if not len(rows):
            return
        mine = keys[rows]
        self.counts["unknown"] += int(np.count_nonzero(mine < 0))
        budget = MAX_TAKE
        for key in np.unique(mine[mine >= 0]).tolist():
            device, name, ledger = profile_of(key)
            records = events[rows[mine == key]]
            if ledger is None:
                self.counts["unknown"] += len(records)
                continue
            buffers = records["kind"] == Kind.BUFFERS
            if buffers.any():
                self._take_buffers(device, name, ledger, records[buffers])
                records = records[~buffers]
            budget -= self._take_profile(device, name, ledger, records, budget)

    def _take_buffers(self, device: int, name: str, ledger: ProfileLedger,
                      records: np.ndarray) -> None:
        """Keep, per dim, the last valid BUFFERS record of one profile's (module docstring)."""
        dims = list(ledger.dims.values())
        index = records["chunks"][:, 0].astype(np.int64)
        values = records["values"]
        ok = (records["ndim"] == MAX_DIMS) & (index < len(dims)) & (values[:, 3] == 0)
        ok &= ((values[:, 2] >= 0) & (values[:, 2] <= values[:, 1])
               & (values[:, 1] <= MAX_GRAPH_BYTES))
        at = np.where(ok, index, 0)
        ok &= ((values[:, 0] >= np.array([d.min for d in dims])[at])
               & (values[:, 0] <= np.array([d.max for d in dims])[at]))
        self.counts["invalid"] += int(np.count_nonzero(~ok))
        valid = np.flatnonzero(ok)
        last = {int(index[i]): i for i in valid.tolist()}  # the last of each dim
        names = list(ledger.dims)
        for i, row in last.items():
            cap, total, scaling, _ = values[row].tolist()
            try:
                line = buffer_line(cap, total, scaling)
            except ShapeError:
                self.counts["invalid"] += 1
                continue
            self._buffers.setdefault((device, name), {})[names[i]] = line
        self.buffer_reports += len(valid)

    def _take_profile(self, device: int, name: str, ledger: ProfileLedger,
                      records: np.ndarray, budget: int) -> int:
        """Keep the valid records of one profile, at most `budget`; returns how many."""
        dims = list(ledger.dims.items())
        index = records["chunks"][:, 0].astype(np.int64)
        values = records["values"]
        ok = (records["ndim"] == MAX_DIMS) & (index < len(dims))
        ok &= ((values[:, 1] >= 0) & (values[:, 1] <= MAX_NS) & (values[:, 3] >= 0)
               & (values[:, 3] <= MAX_NS) & (values[:, 2] >= 0)
               & (values[:, 2] <= MAX_GRAPH_BYTES))
        at = np.where(ok, index, 0)
        low = np.array([d.min for _, d in dims])[at]
        high = np.array([d.max for _, d in dims])[at]
        ok &= (values[:, 0] >= low) & (values[:, 0] <= high)
        valid = np.flatnonzero(ok)
        self.counts["invalid"] += len(records) - len(valid) + max(len(valid) - budget, 0)
        known = {d: {*ledger.gears[d].gears, *ledger.gears[d].evicted, *dim.initial_gears}
                 for d, dim in dims}
        kept = 0
        for i in valid[:max(budget, 0)].tolist():
            dim = dims[int(index[i])][0]
            gear, capture_ns, nbytes, replay_ns = values[i].tolist()
            if gear not in known[dim]:
                self.counts["unknown"] += 1
                continue
            try:
                m = Measurement(gear, capture_ns * 1e-9, nbytes, replay_ns * 1e-9)
            except ShapeError:
                self.counts["invalid"] += 1
                continue
            self.add(device, name, dim, m)
            kept += 1
        self.counts["measured"] += kept
        return kept

    def view(self, device: int, profile: str) -> dict[str, dict[str, Any]]:
        """Per measured dim, the status document's figures: measurements, per gear measured
        (ascending; the VIEW_GEARS measured last) how many, their median replay and capture
        seconds and the fitted curves at those gears (the replay's None below two gears), and
        graph bytes as a + b·gear."""
        out = {}
        book = self._book.get((device, profile), {})
        for dim, c in self.costs(device, profile).items():
            gears = sorted(list(book[dim])[-VIEW_GEARS:])
            ms = [book[dim][g] for g in gears]
            out[dim] = {
                "measurements": c.measurements,
                "gears": gears,
                "counts": [len(m) for m in ms],
                "replay_seconds": [float(np.median([x.replay_seconds for x in m])) for m in ms],
                "replay_fit": _at(c.replay, gears),
                "capture_seconds": [float(np.median([x.capture_seconds for x in m])) for m in ms],
                "capture_fit": _at(c.capture, gears),
                "graph_bytes": {"a": c.bytes.a, "b": c.bytes.b},
            }
        return out

    def state(self, device: int, profile: str) -> dict[str, list[list[float]]]:
        """The state file's rows of a profile (module docstring)."""
        return {d: [[m.gear, m.capture_seconds, m.graph_bytes, m.replay_seconds] for m in ms]
                for d, ms in self.measurements(device, profile).items()}


def _at(curve: Curve | None, gears: list[int]) -> list[float] | None:
    return None if curve is None else [float(curve(g)) for g in gears]


def from_state(profile: str, dims: Mapping[str, Dim],
               saved: Any) -> dict[str, list[Measurement]]:
    """The measurements of a state file's rows (`CostBook.state`), each checked as a worker's
    are (a known dim, the gear within its bounds, Measurement's bounds); StateError naming the
    profile and dim otherwise."""
    if not isinstance(saved, Mapping):
        raise StateError(f"profile {profile!r}: costs are dim -> rows, got {type(saved).__name__}")
    out = {}
    for dim, rows in saved.items():
        if dim not in dims:
            raise StateError(f"profile {profile!r}: costs of unknown dim {str(dim)[:60]!r}")
        if not isinstance(rows, list):
            raise StateError(f"profile {profile!r} dim {dim!r}: costs are a list of rows")
        spec, ms = dims[dim], []
        for row in rows:
            try:
                gear, capture, nbytes, replay = row
                m = Measurement(gear, capture, nbytes, replay)
            except (TypeError, ValueError, ShapeError) as e:
                raise StateError(f"profile {profile!r} dim {dim!r}: cost row {row!r:.80}: "
                                 f"{str(e)[:100]}") from None
            if not spec.min <= m.gear <= spec.max:
                raise StateError(f"profile {profile!r} dim {dim!r}: cost of gear {m.gear} "
                                 f"outside [{spec.min}, {spec.max}]")
            ms.append(m)
        out[dim] = ms
    return out
