"""A full /dev/shm (a private tmpfs): no process dies of SIGBUS; a worker with no room for its
ring serves unrecorded, the controller refuses a registration whose region has no room and
goes on consuming the other workers' events."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

from gearshift.controller.footprint import footprint

SCRIPT = Path(__file__).with_name("full_shm.py")


def test_a_worker_and_the_controller_survive_a_full_dev_shm(
    namespace: str, tiny_shm: Callable[..., object], tmp_path: Path
) -> None:
    need = footprint(slots=4)
    size = need.total(2, 1) + (256 << 10)  # the controller, workers A and B, and some room
    done = tiny_shm([sys.executable, str(SCRIPT), "main", namespace, str(tmp_path)], size)
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout)
    assert found["serve_exit"] == 0, found["serve_log"]
    assert found["serve_warned"]
    assert found["b"]["exit"] == 0 and found["b"]["slot"] is None, found["b"]["log"]
    assert found["b"]["unrecorded"] == 20_000 and found["b"]["attached"]  # at a later try
    assert found["b"]["log"].count(f"no room for /gearshift.{namespace}.ring.") == 1
    assert found["c"]["exit"] == 0 and found["c"]["refused"] == "SpaceError", found["c"]
    assert f"/gearshift.{namespace}.snap.1: it needs" in found["c"]["message"]
    assert found["all_consumed"] and found["consumed"] == found["recorded"]
