"""The positive run: the same gloo ranks as the negative control (two, and four), each a
rank of one group (`gs.group`, `GroupRank`), under a controller deciding every 0.5 s, the last
rank's captures slower: no rank fails or hangs, every step's gear is the same on every rank
(all-gathered outside gearshift), and every output equals the unsharded block on the unpadded
input."""

from __future__ import annotations

from multiprocessing.context import BaseContext
from pathlib import Path

import pytest

from tp import ranks
from tp.launch import controller, lockstep, run_ranks

DEADLINE = 90.0
TOLERANCE = 1e-10  # float64
SAME = ("captured", "capture_failures", "released", "replays", "eager", "versions", "routed",
        "late", "steps")  # the same on every rank: what the driver carried

@pytest.mark.parametrize(("size", "steps"), [(2, 120), (4, 30)])
def test_grouped_ranks_replay_the_same_gear_every_step_and_match_the_reference(
    size: int, steps: int, mp: BaseContext, namespace: str, tmp_path: Path
) -> None:
    with controller(namespace, tmp_path, "check_interval_seconds=0.5",
                    "update_interval_seconds=0.5"):
        out = run_ranks(mp, ranks.grouped, size,
                        (ranks.Run(namespace, steps=steps, slow=0.05),), deadline=DEADLINE)
    stats = lockstep(out, size, steps, TOLERANCE)
    for one in stats:
        assert one["captured"] > 0 and one["replays"] > 0 and one["resets"] == 0, one
        assert one["usable sets"] > 1, one  # the usable set moved during the run
        same = {k: v for k, v in one.items() if k in SAME}
        assert same == {k: v for k, v in stats[0].items() if k in SAME}
