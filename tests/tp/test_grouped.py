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
from tp.launch import controller, run_ranks

DEADLINE = 90.0
TOLERANCE = 1e-10  # float64


@pytest.mark.parametrize(("size", "steps"), [(2, 120), (4, 30)])
def test_grouped_ranks_replay_the_same_gear_every_step_and_match_the_reference(
    size: int, steps: int, mp: BaseContext, namespace: str, tmp_path: Path
) -> None:
    with controller(namespace, tmp_path, "check_interval_seconds=0.5",
                    "update_interval_seconds=0.5"):
        out = run_ranks(mp, ranks.grouped, size, (11, steps, namespace, 0.01, 0.05),
                        deadline=DEADLINE)
    assert not out.hung and out.exitcodes == [0] * size and not out.of("error"), out.reports
    assert not out.of("step"), out.of("step")
    done = sorted(out.of("done"))
    assert [d[1] for d in done] == list(range(size))
    for _, _, served, worst, differed, stats in done:
        assert served == steps and differed == 0 and worst <= TOLERANCE
        assert stats["captured"] > 0 and stats["replays"] > 0, stats
        assert stats["usable sets"] > 1, stats  # the usable set moved during the run
        same = {k: v for k, v in stats.items() if k != "usable sets"}  # (each rank's read)
        assert same == {k: v for k, v in done[0][5].items() if k != "usable sets"}
