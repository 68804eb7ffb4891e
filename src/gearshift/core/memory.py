"""The graph memory bound of a device: how many bytes its priced dims' graphs may hold.

A graph's bytes are its dim's measured `Line` (A + B·gear, per worker), or, where nothing was
measured (no fit yet, or graphs measured at 0 bytes, as a cpu graph without outputs is), the
model `MODEL_GRAPH_BYTES` a graph: the bound then counts graphs. Beside its graphs, a profile
holds its runner's static input buffers, which all its graphs read and its largest gears size:
counted once per profile and worker, at the largest gears (`costs.buffer_bytes`), where a
worker reported them, else not at all. By default a device's graphs (and buffers) hold at most
what its start-up gears held (every priced dim's `Dim.initial_gears`, on every worker, with the
buffers at their largest) times `graph_memory_budget_ratio` (1.25: a quarter more, the slack),
and never less than the floor: `FLOOR_GRAPHS` graphs of each priced dim's largest start-up gear
beside those buffers (a profile started on one or two gears can still grow), nor
`graph_memory_floor_ratio` (0.5 %) of the device's memory where its workers report it (bytes
below that are not worth padding for); `graph_memory_budget_bytes` sets the bound in bytes
instead; with both None there is none.
Pure: prices, dims and the device's memory in, bytes out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from gearshift.core.config import PolicyConfig
from gearshift.core.costs import Line, Prices, buffer_bytes
from gearshift.core.dims import Dim

MODEL_GRAPH_BYTES = 2 << 20  # unmeasured: a graph's private pool is at least one 2 MiB segment
FLOOR_GRAPHS = 2  # at least this many graphs of each dim's largest start-up gear: a ladder of
# powers of two already holds about that (its gears sum to about twice its largest), so the floor
# binds only on a short start, one gear or two, which can then grow by as many bytes again


def graph_bytes(measured: Line) -> Line:
    """The bytes a graph of each gear holds: `measured`, or the model where it is zero."""
    return measured if measured.a > 0 or measured.b > 0 else Line(float(MODEL_GRAPH_BYTES))


Dims = Mapping[str, Mapping[str, Dim]]  # per profile, per dim
PriceBook = Mapping[str, Mapping[str, Prices]]  # per profile, per dim


def start_bytes(dims: Dims, prices: PriceBook) -> float:
    """The bytes the priced dims' start-up gears hold, on every worker, and their buffers."""
    return sum(p.held_bytes(dims[name][d].initial_gears)
               for name, ps in prices.items() if name in dims
               for d, p in ps.items() if d in dims[name]) + start_buffers(dims, prices)


def floor_bytes(dims: Dims, prices: PriceBook) -> float:
    """FLOOR_GRAPHS graphs of each priced dim's largest start-up gear, on every worker, beside
    the start-up gears' buffers."""
    return sum(FLOOR_GRAPHS * p.held_bytes([dims[name][d].initial_gears[-1]])
               for name, ps in prices.items() if name in dims
               for d, p in ps.items() if d in dims[name]) + start_buffers(dims, prices)


def start_buffers(dims: Dims, prices: PriceBook) -> float:
    """The profiles' static buffers at their start-up gears, on every worker (0 unreported)."""
    return sum(buffer_bytes(ps, {d: dims[name][d].initial_gears[-1]
                                 for d in ps if d in dims[name]})
               for name, ps in prices.items() if name in dims)


def bound(dims: Dims, prices: PriceBook, config: PolicyConfig,
          device_bytes: float | None = None) -> float | None:
    """The device's graph memory bound in bytes (None: unbounded): `graph_memory_budget_bytes`
    when set, else the start-up gears' bytes times `graph_memory_budget_ratio`, at least the
    floor, and at least `graph_memory_floor_ratio` of `device_bytes` (the device's memory;
    None: unknown) (None when the ratio is None too, or no dim is priced)."""
    if config.graph_memory_budget_bytes is not None:
        return float(config.graph_memory_budget_bytes)
    if config.graph_memory_budget_ratio is None or not any(prices.values()):
        return None
    share = (config.graph_memory_floor_ratio or 0.0) * (device_bytes or 0.0)
    return max(config.graph_memory_budget_ratio * start_bytes(dims, prices),
               floor_bytes(dims, prices), share)


def modelled(prices: PriceBook) -> dict[str, dict[str, Prices]]:
    """`prices` with each dim's bytes as `graph_bytes` prices them (the model where unmeasured)."""
    return {name: {d: replace(p, bytes=graph_bytes(p.bytes)) for d, p in ps.items()}
            for name, ps in prices.items()}


def usage(dims: Dims, gears: Mapping[str, Mapping[str, list[int]]], prices: PriceBook,
          config: PolicyConfig, device_bytes: float | None = None
          ) -> tuple[float, float | None, float]:
    """What the priced dims' `gears` hold (their graphs and buffers), the bound, both as a
    round prices them, and the buffers' part of the first."""
    priced = modelled(prices)
    return (held_bytes(gears, priced), bound(dims, priced, config, device_bytes),
            held_buffers(gears, priced))


def device_usage(device: Any, prices: PriceBook, config: PolicyConfig
                 ) -> tuple[float, float | None, float]:
    """`usage` of a `round.DeviceLedger` (its profiles, at its `memory_bytes`): what its priced
    gears hold, its bound, and the buffers' part."""
    profiles = device.profiles
    return usage({n: p.dims for n, p in profiles.items()},
                 {n: p.gear_lists() for n, p in profiles.items()}, prices, config,
                 device.memory_bytes)


def held_bytes(gears: Mapping[str, Mapping[str, list[int]]], prices: PriceBook) -> float:
    """The bytes the priced dims' `gears` (per profile, per dim) hold, on every worker, and
    their profiles' buffers (`held_buffers`)."""
    return sum(p.held_bytes(gears[name][d]) for name, ps in prices.items() if name in gears
               for d, p in ps.items() if d in gears[name]) + held_buffers(gears, prices)


def held_buffers(gears: Mapping[str, Mapping[str, list[int]]], prices: PriceBook) -> float:
    """The profiles' static buffers at the largest of their `gears`, on every worker."""
    return sum(buffer_bytes(ps, {d: gears[name][d][-1] for d in ps
                                 if d in gears[name] and len(gears[name][d])})
               for name, ps in prices.items() if name in gears)
