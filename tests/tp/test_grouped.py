"""The positive run: the same two gloo ranks as the negative control, each a rank of one group
(`gs.group`, `GroupRank`), under a controller deciding every 0.5 s: no rank fails or hangs,
every step's gear is the same on every rank (all-gathered outside gearshift), and every output
equals the unsharded block on the unpadded input."""

from __future__ import annotations

from multiprocessing.context import BaseContext
from pathlib import Path

from tp import ranks
from tp.launch import controller, run_ranks

STEPS = 200
DEADLINE = 60.0
TOLERANCE = 1e-10  # float64


def test_grouped_ranks_replay_the_same_gear_every_step_and_match_the_reference(
    mp: BaseContext, namespace: str, tmp_path: Path
) -> None:
    with controller(namespace, tmp_path, "check_interval_seconds=0.5",
                    "update_interval_seconds=0.5"):
        out = run_ranks(mp, ranks.grouped, 2, (11, STEPS, namespace, 0.01), deadline=DEADLINE)
    assert not out.hung and out.exitcodes == [0, 0] and not out.of("error"), out.reports
    assert not out.of("step"), out.of("step")
    done = sorted(out.of("done"))
    assert [d[1] for d in done] == [0, 1]
    for _, _, served, worst, differed, stats in done:
        assert served == STEPS and differed == 0 and worst <= TOLERANCE
        assert stats["captured"] > 0 and stats["replays"] > 0, stats
        assert stats["usable sets"] > 1, stats  # the usable set moved during the run
    assert done[0][5]["replays"] == done[1][5]["replays"]  # the same steps replayed
