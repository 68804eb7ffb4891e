"""Groups of ranks in the pure core: a declaration's fields and its completion from the world."""

from __future__ import annotations

import pytest

from gearshift.core.group import MAX_GROUP_SIZE, Group, declare
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
