"""The decision round: what is known of each profile on a device, and one round over them.

A `DeviceLedger` holds, per profile, its dims, each dim's gears (`DimGears`) and statistics:
the window's `DimStats`, feeding the plan's history (`PolicyConfig.history`). `decide_round`
reads a ledger at `now` with a memory reading and returns a `Round`, the new gears and why;
`DeviceLedger.apply` makes it the ledger's (`DeviceLedger.snapshot`: a copy to decide on in
another thread while the ledger's statistics go on folding). The controller, the embedded
controller and the simulator all decide through these two calls. Pure: no clock, I/O, threads
or torch; a caller that must outlive a failing profile passes `on_error`, and that profile keeps
its gears.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from gearshift.core.config import PolicyConfig
from gearshift.core.costs import Prices, spent
from gearshift.core.dims import Dim
from gearshift.core.fleet import Views, with_prior
from gearshift.core.gears import DimGears, GearChange, starting_gears
from gearshift.core.memory import bound, held_bytes, modelled
from gearshift.core.policy import decide, should_update
from gearshift.core.stats import DimStats


@dataclass
class ProfileLedger:
    """One profile on one device: its dims, each dim's gears, and its statistics (the
    window's, each feeding its `history`). `group`: the group of ranks it belongs to (None:
    none), decided by `core.group.decide_group`, never by the device's round."""

    dims: dict[str, Dim]
    gears: dict[str, DimGears]
    stats: dict[str, DimStats]
    group: str | None = None

    @classmethod
    def new(cls, dims: Mapping[str, Dim], now: float, config: PolicyConfig) -> ProfileLedger:
        return cls(dict(dims), starting_gears(dims, now),
                   {d: DimStats(config, DimStats(config.history())) for d in dims})

    @property
    def history(self) -> dict[str, DimStats]:
        """Each dim's history: the DimStats its window's statistics feed."""
        return {d: s.history for d, s in self.stats.items() if s.history is not None}

    def gear_lists(self) -> dict[str, list[int]]:
        return {d: list(s.gears) for d, s in self.gears.items()}


@dataclass(frozen=True)
class Round:
    """One device's decision round at `now`: why it ran, and per profile its new gears and
    the changes that led there (in order)."""

    now: float
    trigger: str
    gears: dict[str, dict[str, DimGears]]
    changes: dict[str, tuple[GearChange, ...]]

    @property
    def changed(self) -> bool:
        """Whether any gear was added or evicted (a protection alone changes no gear)."""
        return any(c.action != "protect" for cs in self.changes.values() for c in cs)


@dataclass
class DeviceLedger:
    """Everything decided for one device; `version` (of its snapshot) only ever increases.
    `memory_bytes` is the device's memory as its workers last read it (None: never read): the
    bound's share floor (`memory.bound`), kept with the ledger so that a restarted controller
    bounds the gears it restores as it bounded them."""

    version: int = 0
    last_update: float | None = None
    profiles: dict[str, ProfileLedger] = field(default_factory=dict)
    memory_bytes: float | None = None

    def snapshot(self) -> DeviceLedger:
        """A copy that later folds and `apply`s here leave as it is (gears by reference,
        statistics by `DimStats.snapshot`), for a round decided in another thread."""
        return DeviceLedger(self.version, self.last_update, {
            name: ProfileLedger(dict(p.dims), dict(p.gears),
                                {d: s.snapshot() for d, s in p.stats.items()}, p.group)
            for name, p in self.profiles.items()}, self.memory_bytes)

    def apply(self, round: Round) -> None:
        """Make `round`'s gears the ledger's, as of its `now`."""
        for name, gears in round.gears.items():
            self.profiles[name].gears = gears
        self.last_update = round.now


def decide_round(device: DeviceLedger, now: float, memory_usage: float | None,
                 config: PolicyConfig,
                 on_error: Callable[[str, Exception], None] | None = None,
                 prices: Mapping[str, Mapping[str, Prices]] | None = None,
                 prior: Mapping[str, Mapping[str, Views]] | None = None) -> Round | None:
    """The round due on `device` at `now` (`should_update`), or None when none is due or no
    profile was decided. Reads the ledger, never changes it. A profile whose decision raises
    propagates the error, or with `on_error` is reported to it (name, error) and left out of
    the round: it keeps its gears, the others are decided. `prices` (per profile, per dim:
    measured costs as data) price plan mode's moves, each graph at its `memory.graph_bytes`;
    under the device's bound (`memory.bound`, at the ledger's `memory_bytes`) they share its
    headroom (the bound less the
    bytes of every priced dim's gears and of their profiles' buffers): each profile, and each
    dim, gets what those decided before it left. A profile of a group is left out (its gears
    count in what the device holds)."""
    trigger = should_update(device.last_update, now, memory_usage, config)
    if trigger is None:
        return None
    prices = modelled(prices or {})
    budget = bound({n: p.dims for n, p in device.profiles.items()}, prices, config,
                   device.memory_bytes)
    prices = _with_headroom(device, prices, budget)
    gears, changes = {}, {}
    for name, p in device.profiles.items():
        if p.group is not None:  # decided once for its group (`core.group`), its gears held
            continue
        try:
            extra = (prior or {}).get(name, {})
            window = {d: with_prior(s.view(now), extra.get(d), 0) for d, s in p.stats.items()}
            history = {d: with_prior(s.view(now), extra.get(d), 1)
                       for d, s in p.history.items()}
            mine = prices.get(name)
            decision = decide(p.dims, p.gears, window, memory_usage, now, config, history,
                              mine)
            if mine and budget is not None:  # the next profiles get what this one left
                left = next(iter(mine.values())).headroom - spent(mine, p.gears, decision.gears)
                prices = {n: {d: replace(pr, headroom=left) for d, pr in ds.items()}
                          for n, ds in prices.items()}
        except Exception as e:
            if on_error is None:
                raise
            on_error(name, e)
            continue
        gears[name], changes[name] = decision.gears, decision.changes
    return Round(now, trigger, gears, changes) if gears else None


def _with_headroom(device: DeviceLedger, prices: Mapping[str, Mapping[str, Prices]],
                   budget: float | None) -> Mapping[str, Mapping[str, Prices]]:
    if budget is None:
        return prices
    held = held_bytes({n: p.gear_lists() for n, p in device.profiles.items()}, prices)
    return {name: {d: replace(pr, headroom=budget - held) for d, pr in dims.items()}
            for name, dims in prices.items()}
