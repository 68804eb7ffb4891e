"""The one-dim graph runner (one graph per gear), step by step."""

from __future__ import annotations

import pytest
import torch

import gearshift as gs
from gearshift.graphs import GraphRunner


def fn(x: torch.Tensor) -> torch.Tensor:
    return x * 2 + 1


def batch(bs: int) -> torch.Tensor:
    return torch.full((bs, 3), float(bs))


def rows(t: torch.Tensor) -> list[float]:
    return t[:6, 0].tolist()


@pytest.fixture
def runner() -> GraphRunner:
    r = GraphRunner(fn, [16, 1, 4], hidden=3)
    r.capture()
    return r


def test_construction_and_capture(runner: GraphRunner) -> None:
    assert runner.gears == (1, 4, 16)
    assert runner.static_in.shape == runner.static_out.shape == (16, 3)
    assert runner.static_in.dtype == torch.float32
    assert sorted(runner.graphs) == [1, 4, 16]
    assert runner.static_in.eq(0).all() and runner.static_out.eq(1).all()  # capture ran fn(0)
    assert runner.stats == {"replays": 0, "eager": 0, "last_gear": None}


def test_capture_records_the_largest_gear_first() -> None:
    """The order the gears' graphs are recorded in, as `fn` sees it: largest first, whatever
    order the gears were given in (mutation caught: `capture` walking the gears upwards)."""
    recorded: list[int] = []

    def recording(x: torch.Tensor) -> torch.Tensor:
        recorded.append(x.shape[0])
        return fn(x)

    GraphRunner(recording, [4, 1, 16, 2], hidden=3).capture()
    assert recorded == [16, 4, 2, 1]


def test_seed_example_1(runner: GraphRunner) -> None:
    ids = {b: id(g) for b, g in runner.graphs.items()}
    stats = runner.stats

    y = runner.run(batch(10))  # 1.
    assert torch.equal(y, fn(batch(10)))
    assert stats == {"replays": 1, "eager": 0, "last_gear": 16}
    assert rows(runner.static_in) == [10] * 6 and rows(runner.static_out) == [21] * 6
    assert runner.static_out[10:16].eq(1).all()  # padding rows ran fn(0)

    y = runner.run(batch(3))  # 2.
    assert torch.equal(y, fn(batch(3)))
    assert stats == {"replays": 2, "eager": 0, "last_gear": 4}
    assert rows(runner.static_in) == [3, 3, 3, 0, 10, 10]
    assert rows(runner.static_out) == [7, 7, 7, 1, 21, 21]

    before = runner.static_in.clone(), runner.static_out.clone()
    y = runner.run(batch(17))  # 3. no gear >= 17
    assert torch.equal(y, fn(batch(17)))
    assert stats == {"replays": 2, "eager": 1, "last_gear": 4}
    assert torch.equal(runner.static_in, before[0]) and torch.equal(runner.static_out, before[1])

    y = runner.run(batch(4))  # 4.
    assert torch.equal(y, fn(batch(4)))
    assert stats == {"replays": 3, "eager": 1, "last_gear": 4}
    assert rows(runner.static_in) == [4, 4, 4, 4, 10, 10]
    assert rows(runner.static_out) == [9, 9, 9, 9, 21, 21]

    before = runner.static_in.clone(), runner.static_out.clone()
    y = runner.run(batch(1), force_eager=True)  # 5.
    assert torch.equal(y, fn(batch(1)))
    assert stats == {"replays": 3, "eager": 2, "last_gear": 4}
    assert torch.equal(runner.static_in, before[0]) and torch.equal(runner.static_out, before[1])

    y = runner.run(batch(1))  # 6.
    assert torch.equal(y, fn(batch(1)))
    assert stats == {"replays": 4, "eager": 2, "last_gear": 1}
    assert rows(runner.static_in) == [1, 4, 4, 4, 10, 10]
    assert rows(runner.static_out) == [3, 9, 9, 9, 21, 21]

    assert {b: id(g) for b, g in runner.graphs.items()} == ids  # never re-captured


def test_result_is_a_clone(runner: GraphRunner) -> None:  # 7.
    y1 = runner.run(batch(2))
    y2 = runner.run(batch(3))
    assert torch.equal(y1, fn(batch(2))) and torch.equal(y2, fn(batch(3)))
    assert y1.data_ptr() != runner.static_out.data_ptr()


def test_padding_rows_zeroed_only_within_gear(runner: GraphRunner) -> None:
    runner.run(batch(13))
    runner.run(batch(5))  # gear 16: rows [5, 16) zeroed
    assert runner.static_in[5:16].eq(0).all()
    runner.run(batch(3))
    assert runner.static_in[3].eq(0).all() and runner.static_in[4:5].eq(5).all()


def test_uncaptured_gear_runs_eager_without_capturing() -> None:
    r = GraphRunner(fn, [1, 4], hidden=3)
    y = r.run(batch(2))
    assert torch.equal(y, fn(batch(2)))
    assert r.graphs == {} and r.stats["eager"] == 1 and r.static_in.eq(0).all()


def test_bad_gears() -> None:
    with pytest.raises(gs.ShapeError):
        GraphRunner(fn, [0, 4], hidden=3)
    with pytest.raises(gs.ShapeError):
        GraphRunner(fn, [], hidden=3)
