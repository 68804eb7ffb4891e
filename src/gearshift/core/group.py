"""Groups of ranks: the ranks of one tensor-parallel instance as one decision unit.

A `Group` is what a rank declares: the group's name, the rank's index and the group's size.
`declare` completes a declaration from the world `torch.distributed` reports (the caller reads
it; explicit arguments win). Pure: no clock, I/O, threads or torch (docs/architecture.md,
"Tensor parallel").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gearshift.core.dims import brief
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
