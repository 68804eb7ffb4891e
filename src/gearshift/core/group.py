"""Groups of ranks: the ranks of one tensor-parallel instance as one decision unit.

A `Group` is what a rank declares: the group's name, the rank's index and the group's size.
`declare` completes a declaration from the world `torch.distributed` reports (the caller reads
it; explicit arguments win). `decide_group` is the group's one decision round, shared by the
controller and the simulator. `GEAR_TIMELINE` is one gear's lifecycle in a group (`advance`).
Pure: no clock, I/O, threads or torch (docs/architecture.md, "Tensor parallel").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gearshift.core.config import PolicyConfig
from gearshift.core.dims import brief
from gearshift.core.memory import PriceBook, bound, held_bytes, modelled
from gearshift.core.policy import decide, should_update
from gearshift.core.round import DeviceLedger, Round
from gearshift.errors import GroupError

MAX_GROUP_SIZE = 64  # ranks of one group: the largest tensor-parallel x expert-parallel node
_NAME_CHARACTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


@dataclass(frozen=True)
class Group:
    """Rank `rank` of group `name` of `size` ranks; GroupError when a field is invalid."""

    name: str
    rank: int
    size: int

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and 1 <= len(self.name) <= 64
                and set(self.name) <= _NAME_CHARACTERS):
            raise GroupError(f"group name {brief(self.name)} is not 1..64 characters of "
                             "[A-Za-z0-9_.-]")
        for key, value, low, high in (("size", self.size, 1, MAX_GROUP_SIZE),
                                      ("rank", self.rank, 0, self.size - 1)):
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise GroupError(f"group {self.name!r}: {key} {brief(value)} is outside "
                                 f"[{low}, {high}]")

    def fields(self) -> list[Any]:
        """[name, rank, size]: the group as a registration carries it."""
        return [self.name, self.rank, self.size]


def declare(name: str, rank: int | None = None, size: int | None = None,
            world: tuple[int, int] | None = None) -> Group:
    """Rank `rank` of group `name` of `size` ranks; a rank or size not given is the world's
    (`world`: (rank, size) of an initialized `torch.distributed`, None when it is not);
    GroupError when one is missing from both."""
    if rank is None or size is None:
        if world is None:
            raise GroupError(f"group {name!r}: give its rank and size, or initialize "
                             "torch.distributed first (they are read from it)")
        rank = world[0] if rank is None else rank
        size = world[1] if size is None else size
    return Group(name, rank, size)


def headroom(device: DeviceLedger, prices: PriceBook, config: PolicyConfig) -> float | None:
    """The bytes `device` may still take under its graph memory bound (`memory.bound`, at its
    `memory_bytes`): the bound less what every profile's gears hold there; None: unbounded."""
    priced = modelled(prices)
    budget = bound({n: p.dims for n, p in device.profiles.items()}, priced, config,
                   device.memory_bytes)
    if budget is None:
        return None
    return budget - held_bytes({n: p.gear_lists() for n, p in device.profiles.items()}, priced)


def decide_group(name: str, devices: Sequence[DeviceLedger], recorder: int,
                 last_update: float | None, now: float, memory_usage: float | None,
                 config: PolicyConfig, prices: Sequence[PriceBook] | None = None
                 ) -> Round | None:
    """The round of grouped profile `name`, held on each of `devices` (one per live rank),
    at `now` (`should_update` from the group's `last_update`), or None when none is due.

    One decision for the group: the statistics are `devices[recorder]`'s (the recorder's rank
    records each step once; the others' ledgers, which saw the same steps, are not read), and
    its gears are that ledger's. Its dims are priced as the recorder's device prices them
    (`prices`: per device, aligned with `devices`), under the least headroom of the devices
    (`headroom`): a gear set the group adds must fit on every rank's device. Reads the ledgers,
    never changes them; the caller applies the round's gears to `name` on every device."""
    trigger = should_update(last_update, now, memory_usage, config)
    if trigger is None:
        return None
    books = list(prices) if prices is not None else [{} for _ in devices]
    p = devices[recorder].profiles[name]
    mine = modelled(books[recorder]).get(name)
    if mine:
        rooms = [r for d, book in zip(devices, books, strict=True)
                 if (r := headroom(d, book, config)) is not None]
        if rooms:
            mine = {d: replace(pr, headroom=min(rooms)) for d, pr in mine.items()}
    window = {d: s.view(now) for d, s in p.stats.items()}
    history = {d: s.view(now) for d, s in p.history.items()}
    decision = decide(p.dims, p.gears, window, memory_usage, now, config, history, mine or None)
    return Round(now, trigger, {name: decision.gears}, {name: decision.changes})


Variant = tuple[int, ...]  # a gear per dim, in the profile's dim order: one graph


def usable(holds: Mapping[int, frozenset[Variant]], size: int) -> frozenset[Variant]:
    """The variants every one of the `size` ranks holds (`holds`: per rank, its last report);
    none while a rank has not reported: nothing is usable that some rank may lack."""
    if any(r not in holds for r in range(size)):
        return frozenset()
    return frozenset.intersection(*(holds[r] for r in range(size)))


def usable_at(marks: Mapping[int, tuple[int, int]], size: int) -> tuple[int, int] | None:
    """(epoch, least count) of the `size` ranks' last reports (`marks`: per rank, its epoch and
    count of maintenances) when all have reported in one epoch, else None: a report counts
    toward a usable gear only when it was made after the maintenance that captured it."""
    if any(r not in marks for r in range(size)) or len({marks[r][0] for r in range(size)}) != 1:
        return None
    return marks[0][0], min(marks[r][1] for r in range(size))


# One gear's lifecycle in a group: (state, event) -> next state. Who acts on each event is in
# docs/architecture.md, "A group's gear: the timeline" (the same table).
GEAR_TIMELINE: dict[tuple[str, str], str] = {
    ("absent", "decide"): "decided",  # the group's round adds it (version v)
    ("decided", "adopt"): "adopted",  # a rank adopts v
    ("adopted", "announce"): "capturing",  # the driver announces its capture
    ("capturing", "capture"): "held",  # every rank captures it between two steps
    ("capturing", "fail"): "partial",  # a rank's capture fails: held on the others only
    ("partial", "remove"): "retiring",  # never usable; released together when it leaves
    ("held", "report"): "usable",  # every rank's report holds it
    ("usable", "read"): "routed",  # the driver reads the snapshot that makes it usable
    ("routed", "remove"): "retiring",  # a round removes it and the driver adopts that version
    ("retiring", "release"): "released",  # the driver announces its release
    # a rank was replaced or lacks it: every rank drops every graph at one boundary
    **{(state, "reset"): "adopted" for state in ("held", "partial", "usable", "routed")},
    ("retiring", "reset"): "released",
}


def advance(state: str, event: str) -> str:
    """The state after `event` in `state` (`GEAR_TIMELINE`); GroupError when it has none."""
    try:
        return GEAR_TIMELINE[(state, event)]
    except KeyError:
        raise GroupError(f"a group's gear in state {state!r} has no event {event!r}") from None
