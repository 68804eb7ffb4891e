"""A worker forked after `connect()` (a pre-fork server's, `faults.forked`): the child takes a
slot and a ring of its own, and its exit leaves the parent's slot, ring and embedded
controller's state directory alone."""

from __future__ import annotations

from gearshift.tools.stress import faults


def test_a_forked_child_records_through_its_own_slot_and_leaves_the_parents_alone() -> None:
    found = faults.forked()
    assert found["exit"] == 0 and found["child_exit"] == 0, found["log"]
    child = found["child"]
    assert child["registered"] and child["slot"] != found["parent_slot"]
    assert child["unrecorded"] == 1  # its first request, which started its swap thread
    assert found["claimed_after_idle_child"] == 1  # one that never records claims nothing
    assert found["slot_intact"], (found["row_before"], found["row_after"])  # before: False
    assert found["state_dir_kept"]  # before: False
    total = faults.BEFORE + faults.CHILD + faults.AFTER + found["routed_by_parent_meanwhile"]
    assert found["all_consumed"] and found["consumed"] == found["recorded"] == total
    assert found["unknown"] == found["dropped"] == 0  # before: the child's 5,001 lost
    assert found["state_dir_removed_at_close"]
