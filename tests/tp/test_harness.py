"""The gloo harness itself: two real ranks run the tensor-parallel block with static gears,
every step's gear all-gathered outside the model's communicator, every output checked
against the unsharded block on the unpadded input. If this fails, the negative control below
proves nothing."""

from __future__ import annotations

from multiprocessing.context import BaseContext

import torch

from tp import block, ranks
from tp.launch import run_ranks

TOLERANCE = 1e-10  # float64: sharded partial sums differ from the unsharded ones by rounding


def test_the_sharded_block_equals_the_unsharded_one_on_one_process() -> None:
    full = block.weights(3)
    x = torch.randn(5, block.HIDDEN, dtype=block.DTYPE)
    parts = [block.forward(x, block.shard(full, r, 2)) for r in range(2)]  # no all-reduce:
    assert not torch.allclose(parts[0], block.reference(x, full))  # a shard alone is not it


def test_two_gloo_ranks_on_static_gears_replay_the_same_gear_and_match_the_reference(
    mp: BaseContext,
) -> None:
    steps = 20
    out = run_ranks(mp, ranks.static, 2, (7, steps), deadline=60.0)
    assert not out.hung and out.exitcodes == [0, 0], out.reports
    done = sorted(out.of("done"))
    assert [d[1] for d in done] == [0, 1]
    for _, _, served, worst, differed in done:
        assert served == steps and differed == 0
        assert worst <= TOLERANCE
