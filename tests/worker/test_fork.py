"""A worker forked after `connect()` (a pre-fork server's): the child takes a slot and a ring of
its own, and its exit leaves the parent's slot, ring and embedded controller's state alone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from gearshift.shm import cleanup

SCRIPT = Path(__file__).with_name("forked.py")


def test_a_forked_child_records_through_its_own_slot_and_leaves_the_parents_alone(
    namespace: str,
) -> None:
    try:
        done = subprocess.run([sys.executable, str(SCRIPT), namespace], capture_output=True,
                              text=True, timeout=90)
    finally:
        cleanup(namespace)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["child_exit"] == 0
    assert found["child"]["registered"] and found["child"]["slot"] != found["parent_slot"]
    assert found["child"]["unrecorded"] == 1  # its first request, which started its swap thread
    assert found["slot_intact"] and found["state_dir_kept"]
    assert found["all_consumed"] and found["consumed"] == found["recorded"] == 11000
    assert found["unknown"] == found["dropped"] == 0
    assert found["state_dir_removed_at_close"]
