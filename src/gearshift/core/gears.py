"""The gear-set types every decision speaks in: a dim's gears, a change, a decision.

`DimGears` is immutable: a round returns new ones (`apply`), never edits them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim, Gears


@dataclass(frozen=True)
class DimGears:
    """Gears of one dim, when each was added, and protections set by the replacement-loss rule.

    Plan mode also keeps when gears were evicted (within the protection window: they are not
    added back before it ends) and which gears are `initial`: the Dim's initial gears, there
    from the start and never chosen on evidence (their creation protection is narrower).
    """

    gears: Gears
    created: Mapping[int, float]
    protected_until: Mapping[int, float] = field(default_factory=dict)
    evicted: Mapping[int, float] = field(default_factory=dict)
    initial: frozenset[int] = frozenset()


@dataclass(frozen=True)
class GearChange:
    dim: str
    gear: int
    action: str  # "add" | "evict" | "protect"
    reason: str


@dataclass(frozen=True)
class Decision:
    gears: dict[str, DimGears]
    changes: tuple[GearChange, ...]

    @property
    def changed(self) -> bool:
        """Whether any gear was added or evicted (a protection alone changes no gear)."""
        return any(c.action != "protect" for c in self.changes)


def starting_gears(dims: Mapping[str, Dim], now: float) -> dict[str, DimGears]:
    """Every dim at its initial gears, created at `now`."""
    return {name: DimGears(dim.initial_gears, dict.fromkeys(dim.initial_gears, now),
                           initial=frozenset(dim.initial_gears))
            for name, dim in dims.items()}


def apply(state: DimGears, changes: list[GearChange], now: float, config: PolicyConfig,
           cooling: bool = False) -> DimGears:
    """The state after `changes`; with `cooling` (plan mode), evictions are remembered for the
    protection window."""
    evicted = {c.gear for c in changes if c.action == "evict"}
    added = {c.gear for c in changes if c.action == "add"}
    gears = tuple(sorted(set(state.gears) - evicted | added))
    created = {g: t for g, t in state.created.items() if g in gears} | dict.fromkeys(added, now)
    protected = {g: t for g, t in state.protected_until.items() if g in gears and t > now}
    protected |= {c.gear: now + config.recent_use_protect_seconds
                  for c in changes if c.action == "protect"}
    initial = frozenset(state.initial & set(gears) - added)
    if not cooling:
        return DimGears(gears, created, protected, state.evicted, initial)
    window = config.recent_use_protect_seconds
    gone = {g: t for g, t in state.evicted.items() if now - t < window and g not in gears}
    return DimGears(gears, created, protected, gone | dict.fromkeys(evicted - added, now),
                    initial)
