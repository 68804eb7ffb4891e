"""The groups of ranks the controller follows: who holds each rank of each grouped profile.

A grouped profile is keyed by (group name, profile name); its `Members` are its size, dims and,
per rank, the worker (slot, pid, device) that declared it. `check` refuses, with
ProfileMismatch naming the live holder, a declaration that disagrees with a live member: another
size (for any profile of the group), other dims, or a rank another live worker holds; with no
live member the group is declared anew. A member is live while `alive(slot, pid)` says so (the
controller's slot table): a dead rank's place is free for its restarted process. The
`recorder` of a grouped profile is its lowest live rank: the one rank whose samples are the
group's statistics (docs/architecture.md, "Tensor parallel"). Each rank's last report of
what it holds (`hold`) makes the group's usable set (`core.group.usable`), which `views` gives
each member device's snapshot; a rank declared by a new process holds nothing until it reports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gearshift.core.dims import Dim
from gearshift.core.group import Group, Variant, usable, usable_at
from gearshift.errors import ProfileMismatch


@dataclass(frozen=True)
class Member:
    """The worker that declared one rank."""

    slot: int
    pid: int
    device: int


@dataclass
class Members:
    """One grouped profile: its group's size, its dims and its ranks' workers."""

    size: int
    dims: dict[str, Dim]
    ranks: dict[int, Member] = field(default_factory=dict)
    holds: dict[int, frozenset[Variant]] = field(default_factory=dict)  # last report per rank
    marks: dict[int, tuple[int, int]] = field(default_factory=dict)  # its (epoch, count)
    replaced: int = 0  # ranks declared by another worker than the one that held them


class Groups:
    """Every grouped profile the controller has registered; `alive(slot, pid)`: whether that
    worker still holds its slot."""

    def __init__(self, alive: Callable[[int, int], bool]) -> None:
        self.alive = alive
        self.profiles: dict[tuple[str, str], Members] = {}

    def live(self, key: tuple[str, str]) -> dict[int, Member]:
        """The ranks of grouped profile `key` held by a live worker."""
        members = self.profiles.get(key)
        if members is None:
            return {}
        return {r: m for r, m in members.ranks.items() if self.alive(m.slot, m.pid)}

    def missing(self, key: tuple[str, str]) -> list[int]:
        """The ranks of `key` no live worker holds, in order."""
        members = self.profiles.get(key)
        live = self.live(key)
        return [r for r in range(members.size) if r not in live] if members else []

    def recorder(self, key: tuple[str, str]) -> Member | None:
        """The lowest live rank of `key`: its samples are the group's statistics."""
        live = self.live(key)
        return live[min(live)] if live else None

    def check(self, group: Group, profile: str, dims: Mapping[str, Dim], slot: int,
              pid: int) -> None:
        """Refuse (ProfileMismatch) a declaration that disagrees with a live member."""
        for (name, other), members in self.profiles.items():
            if name != group.name:
                continue
            live = self.live((name, other))
            if not live:
                continue
            holder = live[min(live)]
            if members.size != group.size:
                raise ProfileMismatch(
                    f"group {group.name!r} has {members.size} ranks (pid {holder.pid}); pid "
                    f"{pid} declares {group.size}")
            if other != profile:
                continue
            if list(members.dims.items()) != list(dims.items()):
                raise ProfileMismatch(
                    f"profile {profile!r} of group {group.name!r} has other dims on rank "
                    f"{min(live)} (pid {holder.pid}): every rank must declare the same dims")
            taken = live.get(group.rank)
            if taken is not None and taken.slot != slot:
                raise ProfileMismatch(
                    f"rank {group.rank} of group {group.name!r} (profile {profile!r}) is held "
                    f"by pid {taken.pid}; pid {pid} declares it too")

    def join(self, group: Group, profile: str, dims: Mapping[str, Dim], member: Member
             ) -> list[int]:
        """Record `member` as rank `group.rank` of `profile` (after `check`); a group with no
        live member is declared anew. Returns the member devices whose snapshot must be
        published again: all of them when what they carry of it changed (a new process holds
        nothing), else none."""
        key = (group.name, profile)
        if key not in self.profiles or not self.live(key):
            self.profiles[key] = Members(group.size, dict(dims))
        members = self.profiles[key]
        before = _published(members)
        if members.ranks.get(group.rank) != member:  # a new process holds nothing yet
            members.holds.pop(group.rank, None)
            members.marks.pop(group.rank, None)
            members.replaced += group.rank in members.ranks
        members.ranks[group.rank] = member
        if _published(members) == before:
            return []
        return sorted({m.device for m in members.ranks.values()})

    def hold(self, slot: int, profile: str, variants: frozenset[Variant],
             mark: tuple[int, int] = (0, 0)) -> list[int] | None:
        """Record that `slot`'s worker holds `variants` of `profile` (its rank's last report,
        made in epoch `mark[0]` after `mark[1]` maintenances); returns the group's member
        devices when what their snapshots carry of it changed (the usable set, its `at`,
        whether every rank has reported), else None (also when
        `slot` holds no rank of a grouped `profile`)."""
        for (_, name), members in self.profiles.items():
            rank = next((r for r, m in members.ranks.items() if m.slot == slot), None)
            if name != profile or rank is None:
                continue
            before = _published(members)
            members.holds[rank] = variants
            members.marks[rank] = mark
            if _published(members) == before:
                return None
            return sorted({m.device for m in members.ranks.values()})
        return None

    def views(self, device: int) -> dict[str, dict[str, Any]]:
        """Per grouped profile a live rank of `device` holds: its group's name, size, usable
        variants (sorted), whether every rank has reported (`reported`: an empty usable set
        with every report in means some rank lacks what the others hold, a restarted rank),
        how many times a rank was declared by another worker (`replaced`: the driver resets
        the group when it grows, whatever was usable), and `at`: [epoch, least count] of the
        ranks' last reports when all are of one epoch, else None (the driver routes a gear
        only when `at` is of its epoch and at or past the count that captured it), as the
        device's snapshot carries them."""
        out = {}
        for (group, name), members in self.profiles.items():
            if any(m.device == device for m in self.live((group, name)).values()):
                out[name] = {"name": group, "size": members.size,
                             "usable": sorted(usable(members.holds, members.size)),
                             "reported": _published(members)[1], "replaced": members.replaced,
                             "at": _published(members)[3]}
        return out


def lacking(members: Members) -> dict[int, list[Variant]]:
    """Per rank that has reported, the variants some other rank holds and it lacks (sorted;
    a capture that failed there, or a rank whose process was replaced)."""
    held = frozenset().union(*members.holds.values())
    out = {r: sorted(held - h) for r, h in sorted(members.holds.items())}
    return {r: v for r, v in out.items() if v}


def _published(members: Members
               ) -> tuple[frozenset[Variant], bool, int, list[int] | None]:
    """What a snapshot carries of `members`: its usable set, whether every rank reported, how
    many ranks were replaced and the reports' [epoch, least count] (None: epochs differ)."""
    at = usable_at(members.marks, members.size)
    return (usable(members.holds, members.size),
            all(r in members.holds for r in range(members.size)), members.replaced,
            list(at) if at is not None else None)
