"""The controller's groups of ranks: declarations checked against the live members, ranks
freed by a dead worker, the recorder."""

from __future__ import annotations

import pytest

from gearshift.controller.groups import Groups, Member, lacking
from gearshift.core.dims import Dim
from gearshift.core.group import Group
from gearshift.errors import ProfileMismatch

B = {"B": Dim(max=64)}


def _groups(dead: set[int]) -> Groups:
    return Groups(lambda slot, pid: slot not in dead)


def _join(groups: Groups, rank: int, size: int = 2, dims: dict = B, profile: str = "decode",
          slot: int | None = None) -> None:
    group, slot = Group("tp", rank, size), rank + 10 if slot is None else slot
    groups.check(group, profile, dims, slot, slot + 90)
    groups.join(group, profile, dims, Member(slot, slot + 90, rank))


def test_ranks_join_and_the_lowest_live_rank_records() -> None:
    dead: set[int] = set()
    groups = _groups(dead)
    _join(groups, 1)
    assert groups.missing(("tp", "decode")) == [0]
    _join(groups, 0)
    assert groups.missing(("tp", "decode")) == []
    assert groups.recorder(("tp", "decode")) == Member(10, 100, 0)
    dead.add(10)  # rank 0's worker died: rank 1 records, rank 0 is missing
    assert groups.recorder(("tp", "decode")) == Member(11, 101, 1)
    assert groups.missing(("tp", "decode")) == [0]


def test_a_declaration_disagreeing_with_a_live_member_is_refused_naming_it() -> None:
    groups = _groups(set())
    _join(groups, 0)
    with pytest.raises(ProfileMismatch, match="has 2 ranks"):
        _join(groups, 1, size=4)
    with pytest.raises(ProfileMismatch, match="has 2 ranks"):
        _join(groups, 1, size=4, profile="prefill")  # the size is the group's, every profile
    with pytest.raises(ProfileMismatch, match="same dims"):
        _join(groups, 1, dims={"B": Dim(max=32)})
    other = Group("tp", 0, 2)
    with pytest.raises(ProfileMismatch, match=r"rank 0 .* held by pid 100"):
        groups.check(other, "decode", B, 99, 999)
    groups.check(other, "decode", B, 10, 100)  # the holder itself declares it again: fine


def test_a_group_whose_members_all_died_is_declared_anew() -> None:
    dead: set[int] = set()
    groups = _groups(dead)
    _join(groups, 0)
    dead.add(10)
    _join(groups, 0, size=4, dims={"B": Dim(max=32)}, slot=20)  # rank 0 restarted
    assert groups.profiles[("tp", "decode")].size == 4
    assert groups.missing(("tp", "decode")) == [1, 2, 3]


def test_the_snapshots_say_when_every_rank_has_reported_even_if_nothing_became_usable() -> None:
    dead: set[int] = set()
    groups = _groups(dead)
    _join(groups, 0)
    _join(groups, 1)
    assert groups.views(0)["decode"] == {"name": "tp", "size": 2, "usable": [],
                                         "reported": False, "replaced": 0, "at": None}
    assert groups.hold(10, "decode", frozenset({(8,), (16,)})) is None  # nothing changed yet
    assert groups.hold(11, "decode", frozenset({(8,)})) == [0, 1]
    assert groups.views(1)["decode"] == {"name": "tp", "size": 2, "usable": [(8,)],
                                         "reported": True, "replaced": 0, "at": [0, 0]}
    assert lacking(groups.profiles[("tp", "decode")]) == {1: [(16,)]}  # a failed capture
    dead.add(11)
    _join(groups, 1, slot=21)  # rank 1's new process: holds nothing until it reports
    assert groups.views(0)["decode"]["reported"] is False
    assert groups.views(0)["decode"]["usable"] == []
    assert groups.views(0)["decode"]["replaced"] == 1  # the driver resets the group
    assert groups.hold(21, "decode", frozenset()) == [0, 1]  # usable still empty: published
    assert groups.views(0)["decode"]["reported"] is True


def test_the_usable_set_is_published_with_its_reports_epoch_and_least_count() -> None:
    dead: set[int] = set()
    groups = _groups(dead)
    _join(groups, 0)
    _join(groups, 1)
    assert groups.hold(10, "decode", frozenset({(8,)}), (5, 3)) is None  # rank 1 not in yet
    assert groups.views(0)["decode"]["at"] is None
    assert groups.hold(11, "decode", frozenset({(8,)}), (5, 2)) == [0, 1]
    assert groups.views(0)["decode"]["at"] == [5, 2]  # one epoch: the least count
    assert groups.hold(11, "decode", frozenset({(8,)}), (5, 4)) == [0, 1]  # only `at` moved
    assert groups.views(0)["decode"]["at"] == [5, 3]
    assert groups.hold(11, "decode", frozenset({(8,)}), (5, 4)) is None  # nothing changed
    assert groups.hold(10, "decode", frozenset({(8,)}), (6, 1)) == [0, 1]  # a reset: rank 0 in
    assert groups.views(0)["decode"]["at"] is None  # mixed epochs: no report counts
    assert groups.views(0)["decode"]["usable"] == [(8,)]
    assert groups.hold(11, "decode", frozenset(), (6, 1)) == [0, 1]
    assert groups.views(0)["decode"]["at"] == [6, 1]
    dead.add(11)
    _join(groups, 1, slot=21)  # a new process: its report and its mark are gone
    assert groups.views(0)["decode"]["at"] is None
