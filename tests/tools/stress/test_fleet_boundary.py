"""The fleet store's objects under fuzz: a hostile node's pointer or generation never crashes
a reader, never hides a good node and never moves a gear out of its dim's bounds."""

from __future__ import annotations

from gearshift.tools.stress import fuzz
from gearshift.tools.stress.fleet_boundary import _attack
from gearshift.tools.stress.target import Tally


def test_fleet_objects_survive_hostile_and_broken_input() -> None:
    tally = fuzz.run(examples=30, only=["fleet objects"])["fleet objects"]
    assert tally.cases == 30 and tally.refused > 0
    assert tally.clean, "\n".join(tally.failures)


def test_a_generation_that_lies_about_its_size_is_refused_and_the_good_node_read() -> None:
    tally = Tally()
    _attack(("generation", [], None, 1 << 30), tally)
    assert tally.refused == 1 and tally.clean
    tally = Tally()
    _attack(("pointer", [], b"\x92\x01", 0), tally)
    assert tally.refused == 1 and tally.clean
