"""The demo's requests: one or more profiles' workloads merged on one timeline (numpy, no torch).

A `Mix` holds each profile's `Workload` and the order in which the workers take their rows:
merged row j is row `local[j]` of profile `names[which[j]]`, at `times[j]`, each trace's own
time (seconds since its first row), merged in time order (a tie: the first profile's row
first, then row order). A single trace is one profile, `PROFILE`; a source (`azure_conv`, or
`conv`; or a path prefix of two CSV files) is two, `prefill` (its `_prefill` trace, SEQLEN)
and `decode` (its `_decode` trace, BATCHSIZE). A run replays one row in `stride` of every
profile (`Mix.every`): one stride for all, so the profiles keep their rates' ratio, and one
scaling of the policy holds for both (`paced`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gearshift.core.config import PolicyConfig
from gearshift.errors import TraceError
from gearshift.tools.demo.workload import (
    PROFILE,
    Cost,
    Workload,
    load_workload,
    padded_pairs,
)
from gearshift.tools.trace import resolve, shipped_traces

PREFILL, DECODE = "prefill", "decode"  # a source's profiles, and its traces' suffixes


@dataclass(frozen=True)
class Mix:
    """Profiles' workloads on one timeline (module docstring); `name` is the trace or source."""

    name: str
    profiles: dict[str, Workload]
    which: np.ndarray
    local: np.ndarray
    times: np.ndarray
    stride: float = 1.0

    @classmethod
    def of(cls, name: str, profiles: Mapping[str, Workload], stride: float = 1.0) -> Mix:
        """The profiles' rows merged in time order (module docstring)."""
        assert profiles, "at least one profile"
        loads = dict(profiles)
        which = np.concatenate([np.full(w.events, p, np.int64) for p, w in
                                enumerate(loads.values())])
        local = np.concatenate([np.arange(w.events) for w in loads.values()])
        times = np.concatenate([w.times for w in loads.values()])
        order = np.lexsort((local, which, times))
        return cls(name, loads, which[order], local[order], times[order], stride)

    @property
    def names(self) -> list[str]:
        return list(self.profiles)

    @property
    def events(self) -> int:
        return len(self.times)

    @property
    def rows(self) -> int:
        """Rows in the traces, all profiles'."""
        return sum(w.rows for w in self.profiles.values())

    @property
    def duration(self) -> float:
        return max(w.duration for w in self.profiles.values())

    def every(self, stride: float) -> Mix:
        """Rows floor(i x stride) of every profile's full trace (`Workload.every`), merged."""
        assert self.stride == 1, "subsample the full mix"
        loads = {p: w.every(stride) for p, w in self.profiles.items()}
        return Mix.of(self.name, loads, stride)

    def seconds(self, costs: Mapping[str, Cost]) -> np.ndarray:
        """Each merged row's expected seconds on the initial gears, at its profile's cost."""
        out = np.empty(self.events)
        for p, (name, w) in enumerate(self.profiles.items()):
            pairs = padded_pairs(w.dims, w.sizes).astype(np.float64)
            per_row = costs[name].seconds(1.0, w.padded().astype(np.float64), pairs)
            at = self.which == p
            out[at] = per_row[self.local[at]]
        return out


def load_mix(source: str) -> Mix:
    """A trace (path or shipped name: one profile, `PROFILE`) or a source: `azure_conv` or
    `conv` gives `prefill` and `decode` from the shipped `azure_conv_prefill` and
    `azure_conv_decode`, and a path `DIR/NAME` from `DIR/NAME_prefill.csv` and
    `DIR/NAME_decode.csv`. TraceError if none."""
    shipped = set(shipped_traces())

    def trace(base: str, profile: str) -> str | None:
        name = f"{base}_{profile}"
        if name in shipped:
            return name
        return name + ".csv" if Path(name + ".csv").is_file() else None

    if source not in shipped and not Path(source).is_file():
        for base in (source, f"azure_{source}"):
            found = {p: trace(base, p) for p in (PREFILL, DECODE)}
            if None not in found.values():
                loads = {p: load_workload(str(t)) for p, t in found.items()}
                return Mix.of(Path(base).name, loads)
    try:
        resolve(source)
    except TraceError as e:
        sources = sorted({n.rsplit("_", 1)[0] for n in shipped if n.endswith(f"_{DECODE}")})
        raise TraceError(f"{e}; or a source of both profiles: {', '.join(sources)}") from None
    workload = load_workload(source)
    return Mix.of(workload.trace, {PROFILE: workload})


def paced(policy: PolicyConfig, factor: float, stride: float) -> PolicyConfig:
    """`policy` on a run that replays one row in `stride` with time compressed `factor` times:
    windows and intervals stretched by the stride, then compressed, so a window holds as many
    requests as at the trace's full rate; the payback horizon compressed only, for it weighs a
    capture's real seconds against the seconds it saves on the rows replayed (stretched, it
    would count savings over `stride` times more requests than the run replays)."""
    scaled = policy.scaled(factor / stride)
    return dataclasses.replace(scaled, plan_payback_seconds=policy.plan_payback_seconds / factor)


def stride_for(mix: Mix, costs: Mapping[str, Cost], budget: float, parallel: int) -> float:
    """The stride (>= 1) whose static run of every profile, at `costs` on `parallel` cores,
    takes `budget` seconds."""
    return max(1.0, float(mix.seconds(costs).sum()) / parallel / budget)


def slice_ends(mix: Mix, costs: Mapping[str, Cost], count: int) -> list[int]:
    """The merged rows where `count` slices end, cut where the static arm's expected time is
    shared equally (consecutive rows, in order; the last ends at the last row)."""
    seconds = mix.seconds(costs)
    share = np.cumsum(seconds) / float(np.sum(seconds))
    ends = np.searchsorted(share, np.arange(1, count + 1) / count, "left") + 1
    ends[-1] = mix.events
    return sorted({int(e) for e in np.minimum(ends, mix.events)})
