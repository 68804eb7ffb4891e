"""A rank's group declaration (`gs.group`): its arguments, completed from `torch.distributed`.

Torch-free: the world is read only when the process has already imported `torch.distributed`
and initialized it (a process that has not cannot be a rank of a collective group anyway).
"""

from __future__ import annotations

import sys

from gearshift.core.group import Group, declare


def world() -> tuple[int, int] | None:
    """(rank, world size) of an initialized `torch.distributed` in this process, else None."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        return int(dist.get_rank()), int(dist.get_world_size())
    except (AttributeError, RuntimeError):
        return None


def group(name: str, rank: int | None = None, size: int | None = None) -> Group:
    """Rank `rank` of group `name` of `size` ranks, each not given read from an initialized
    `torch.distributed` (explicit arguments win); GroupError when one is missing from both or
    a field is invalid. Pass it as `client.profile(..., group=)` or `gs.compile(..., group=)`."""
    return declare(name, rank, size, world())
