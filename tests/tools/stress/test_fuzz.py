"""The fuzz suite, bounded: every boundary takes hostile and broken input with no crash, no
exception into a request, no stall of the loop, no gear outside its bounds, no leaked segment
and no worker left unanswered (`gearshift stress --fuzz SECONDS` runs it longer)."""

from __future__ import annotations

import pytest

from gearshift.tools.stress import fuzz
from gearshift.tools.stress.boundaries import boundaries
from gearshift.tools.stress.fault_boundaries import faults
from gearshift.tools.stress.target import Tally

EXAMPLES = 15


@pytest.mark.parametrize("boundary", [b.name for b in (*boundaries(), *faults())])
def test_a_boundary_survives_hostile_and_broken_input(boundary: str) -> None:
    tally = fuzz.run(examples=EXAMPLES, only=[boundary])[boundary]
    assert tally.cases == EXAMPLES
    assert tally.clean, "\n".join(tally.failures)


def test_a_real_controller_process_survives_an_attack_from_outside() -> None:
    tally = Tally()
    fuzz.real_processes(2.0, tally)
    assert tally.cases > 10
    assert tally.clean, "\n".join(tally.failures)


def test_a_failure_is_counted_and_described_never_raised() -> None:
    tally = Tally()
    tally.fail("stalls", "step took 150 ms")
    assert (tally.stalls, tally.clean, tally.failures) == (1, False, ["stalls: step took 150 ms"])
    assert "stalls" in fuzz.table({"x": tally})


def test_a_valid_config_with_too_few_slots_for_the_harness_is_refused_not_a_crash() -> None:
    """Before: a generated config with `slots = 1` (valid) let the live client take the only
    slot, and the harness's hostile worker's claim (NamespaceBusy) was counted as a crash,
    a flake of the fuzz suite whenever hypothesis drew it."""
    from gearshift.tools.stress.boundaries import _toml

    tally = Tally()
    _toml("[controller]\nslots = 1\n", tally)
    assert tally.clean and tally.refused == 1, tally.failures
