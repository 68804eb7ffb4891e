from __future__ import annotations

from gearshift.tools.stress import lockfaults
from gearshift.tools.stress.target import Tally


def test_a_stopped_then_dead_lock_holder_row_is_clean() -> None:
    tallies: dict[str, Tally] = {}
    lockfaults.tally(tallies)
    (row,) = tallies.values()
    assert row.cases == 1 and row.clean, row.failures
