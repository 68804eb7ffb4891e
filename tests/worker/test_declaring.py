"""A rank declares its group: read from torch.distributed, carried in its registration,
acknowledged by the controller; refused by a controller that does not echo it."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

import gearshift as gs
from gearshift.worker import Group, declaring

B = {"B": gs.Dim(max=64)}


def test_the_world_is_read_only_from_an_initialized_torch_distributed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)
    assert declaring.world() is None
    with pytest.raises(gs.GroupError):
        gs.group("tp")
    dist = SimpleNamespace(is_available=lambda: True, is_initialized=lambda: False)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    assert declaring.world() is None
    dist.is_initialized = lambda: True
    dist.get_rank, dist.get_world_size = (lambda: 1), (lambda: 4)
    assert gs.group("tp") == Group("tp", 1, 4)
    assert gs.group("tp", rank=3, size=8) == Group("tp", 3, 8)  # explicit arguments win


def test_a_grouped_profile_registers_with_a_controller_that_knows_groups(namespace: str) -> None:
    with gs.connect(namespace, embedded=True) as client:
        prof = client.profile("decode", B, group=Group("tp", 0, 2))
        assert prof.registered and prof.group == Group("tp", 0, 2)
        with pytest.raises(gs.ProfileMismatch, match="is of"):
            client.profile("decode", B, group=Group("tp", 1, 2))
        plain = client.profile("plain", B)  # a profile of no group: as before
        assert plain.registered and plain.group is None


def test_a_controller_that_does_not_echo_the_group_is_refused(fake, client) -> None:
    with pytest.raises(gs.GroupError, match="predates groups"):
        client.profile("decode", B, group=Group("tp", 0, 2))
