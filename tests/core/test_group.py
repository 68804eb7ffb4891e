"""Groups of ranks in the pure core: a declaration's fields and its completion from the world;
the group's one decision round."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from gearshift.core.config import PolicyConfig
from gearshift.core.costs import Line, Prices
from gearshift.core.dims import Dim
from gearshift.core.group import (
    GEAR_TIMELINE,
    MAX_GROUP_SIZE,
    Group,
    advance,
    decide_group,
    declare,
    headroom,
    usable,
    usable_at,
)
from gearshift.core.round import DeviceLedger, ProfileLedger, decide_round
from gearshift.errors import GroupError


def test_a_group_keeps_its_fields_in_registration_order() -> None:
    assert Group("tp-0", 1, 2).fields() == ["tp-0", 1, 2]


@pytest.mark.parametrize("fields", [("", 0, 1), ("a b", 0, 1), ("x" * 65, 0, 1),
                                    ("g", 2, 2), ("g", -1, 2), ("g", 0, 0),
                                    ("g", 0, MAX_GROUP_SIZE + 1), ("g", True, 2), ("g", 0, 2.0),
                                    (3, 0, 1)])
def test_an_invalid_declaration_is_refused_naming_the_field(fields: tuple) -> None:
    with pytest.raises(GroupError):
        Group(*fields)


def test_rank_and_size_come_from_the_world_and_explicit_arguments_win() -> None:
    assert declare("g", world=(3, 4)) == Group("g", 3, 4)
    assert declare("g", rank=1, world=(3, 4)) == Group("g", 1, 4)
    assert declare("g", 0, 2, world=(3, 4)) == Group("g", 0, 2)
    assert declare("g", 0, 2) == Group("g", 0, 2)


def test_a_rank_or_size_missing_from_both_is_refused_saying_what_to_do() -> None:
    with pytest.raises(GroupError, match=r"initialize torch\.distributed"):
        declare("g", rank=0)


# -- one decision per group --

CONFIG = PolicyConfig()
LADDER = {"S": Dim(max=2048)}


def _rank(values: int, group: str | None = "tp", count: int = 200) -> DeviceLedger:
    """A device holding the group's profile "p", its samples `count` requests of `values`."""
    p = ProfileLedger.new(LADDER, 0.0, CONFIG)
    p.group = group
    p.stats["S"].fold(np.linspace(0.1, 0.9, count), np.full(count, values))
    return DeviceLedger(profiles={"p": p})


def test_the_device_round_leaves_a_grouped_profile_to_its_group() -> None:
    device = _rank(300)
    device.profiles["plain"] = _rank(300, group=None).profiles["p"]
    round = decide_round(device, 1.0, None, CONFIG)
    assert round is not None and set(round.gears) == {"plain"}
    assert device.snapshot().profiles["p"].group == "tp"  # the snapshot keeps it


def test_the_group_is_decided_once_from_the_recorder_s_statistics_alone() -> None:
    ranks = [_rank(300), _rank(700, count=2000)]  # rank 1's ledger is not read
    round = decide_group("p", ranks, 0, None, 1.0, None, CONFIG)
    assert round is not None and set(round.gears) == {"p"}
    gears = round.gears["p"]["S"].gears
    assert 300 in gears and 700 not in gears
    assert 700 in decide_group("p", ranks, 1, None, 1.0, None, CONFIG).gears["p"]["S"].gears
    assert decide_group("p", ranks, 0, 1.0, 1.0, None, CONFIG) is None  # none due yet


def test_a_rank_counted_once_decides_as_one_device_would() -> None:
    alone = decide_round(_rank(300, group=None), 1.0, None, CONFIG)
    group = decide_group("p", [_rank(300), _rank(300), _rank(300)], 0, None, 1.0, None, CONFIG)
    assert alone is not None and group is not None
    assert alone.gears["p"] == group.gears["p"] and alone.changes["p"] == group.changes["p"]


def test_the_group_fits_the_tightest_rank_s_device() -> None:
    """A graph holds 16 KiB a unit of its gear (the ladder: 64 MiB less 16 KiB); the bound is
    128 MiB on each device; rank 1's device also holds 51 graphs of another profile, which
    leave it 1 MiB: the group's move to 300 must take at most that (as rank 0 alone would
    not: it swaps the 1 for it, 4.7 MiB more)."""
    config = PolicyConfig(graph_memory_budget_bytes=128 * 2**20)
    book = {"p": {"S": Prices(Line(0.001), bytes=Line(0.0, 2**14))}}
    roomy, tight = _rank(300), _rank(300)
    tight.profiles["other"] = ProfileLedger.new({"B": Dim(gears=tuple(range(1, 52)))}, 0.0,
                                                config)
    left = 128 * 2**20 - 4095 * 2**14 - 2**20
    books = [book, {**book, "other": {"B": Prices(Line(0.001), bytes=Line(left / 51))}}]
    assert headroom(tight, books[1], config) == pytest.approx(2**20)
    wide = decide_group("p", [roomy], 0, None, 1.0, None, config, books[:1])
    both = decide_group("p", [roomy, tight], 0, None, 1.0, None, config, books)
    assert wide is not None and both is not None
    grown = {n: (sum(r.gears["p"]["S"].gears) - 4095) * 2**14
             for n, r in (("wide", wide), ("both", both))}
    assert 300 in both.gears["p"]["S"].gears and 0 < grown["both"] <= 2**20 < grown["wide"]


# -- the usable set --


def test_usable_is_what_every_rank_holds_and_nothing_while_a_rank_is_silent() -> None:
    a, b, c = (8,), (16,), (32,)
    assert usable({0: frozenset({a, b}), 1: frozenset({b, c})}, 2) == {b}
    assert usable({0: frozenset({a, b})}, 2) == frozenset()
    assert usable({0: frozenset({a}), 1: frozenset({a}), 2: frozenset()}, 3) == frozenset()


def test_a_gear_walks_the_timeline_and_the_docs_table_is_the_same() -> None:
    state = "absent"
    for event in ("decide", "adopt", "announce", "capture", "report", "read", "reset",
                  "announce", "capture", "report", "read", "remove", "release"):
        state = advance(state, event)
    assert state == "released"
    with pytest.raises(GroupError):
        advance("decided", "read")  # not routed before every rank holds it
    doc = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()
    table = doc[doc.index("### A group's gear: the timeline"):doc.index("### Faults")]
    rows = {(s.strip(), n.strip()) for states, n in
            re.findall(r"^\| ([a-z, ]+) \| [^|]+ \| ([a-z]+) \|", table, re.M)
            for s in states.split(",")} - {("state", "next state")}
    assert rows == {(s, n) for (s, _), n in GEAR_TIMELINE.items()}


def test_the_usable_set_s_mark_is_one_epoch_s_least_count_or_none() -> None:
    assert usable_at({0: (5, 3), 1: (5, 2)}, 2) == (5, 2)
    assert usable_at({0: (5, 3), 1: (6, 1)}, 2) is None  # mixed epochs: no report counts
    assert usable_at({0: (5, 3)}, 2) is None  # a rank has not reported
