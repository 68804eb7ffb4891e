"""The request path's bounds: a request never builds more chunks than a record counts; gear
positions by table or bisection route alike."""

from __future__ import annotations

import itertools
from array import array
from bisect import bisect_left

import pytest

import gearshift as gs
from gearshift.core.dims import chunks_for
from gearshift.shm import Kind
from gearshift.worker import Client
from gearshift.worker.routing import MAX_CHUNKS, TABLE_MAX, _positions

HUGE = {"B": gs.Dim(gears=[1, 2, 4, 8, 16, 32, 64], max=1 << 40, splittable=True)}


def test_a_split_beyond_the_chunk_bound_runs_eagerly_and_is_counted(client: Client) -> None:
    prof = client.profile("huge", HUGE)
    client.ring.drain()
    fits = prof.route(B=64 * MAX_CHUNKS)  # the most chunks a record counts
    assert len(fits.chunks["B"]) == MAX_CHUNKS and not fits.eager
    for raw in (64 * MAX_CHUNKS + 1, 1 << 22, 1 << 40):  # 4 M chunks, then 17 G: never built
        route = prof.route(B=raw)
        assert route.eager and route.chunks == {"B": ()}
    events = client.ring.drain()
    assert events["kind"].tolist() == [Kind.SHAPE] + [Kind.EAGER] * 3
    assert events["chunks"][:, 0].tolist() == [MAX_CHUNKS, 0, 0, 0]
    assert events["values"][:, 0].tolist() == [64 * MAX_CHUNKS, 64 * MAX_CHUNKS + 1, 1 << 22,
                                               1 << 40]


@pytest.mark.parametrize("top", [TABLE_MAX - 1, TABLE_MAX])  # a table of positions; bisection
def test_gear_positions_by_table_or_bisection_route_as_chunks_for(
    client: Client, top: int
) -> None:
    dims = {
        "A": gs.Dim(gears=[3, 1000, top], min=2, max=1 << 20, splittable=True),
        "B": gs.Dim(gears=[1, 7], max=9),
    }
    prof = client.profile(f"wide{top}", dims)
    assert isinstance(prof._in_use.table[0][3], array) == (top < TABLE_MAX)
    client.ring.drain()
    raws = [2, 3, 4, 999, 1000, 1001, top - 1, top, top + 1, 2 * top + 5]
    for a, b in itertools.product(raws, [1, 2, 7, 8, 9]):
        route = prof.route(A=a, B=b)
        want = {"A": chunks_for(prof.gears["A"], a, True), "B": chunks_for((1, 7), b, False)}
        assert dict(route.chunks) == want, (a, b)
    events = client.ring.drain()
    assert events["values"][:, :2].tolist() == [
        [a, b] for a, b in itertools.product(raws, [1, 2, 7, 8, 9])
    ]
    for bad in ({"A": 1, "B": 1}, {"A": 1 << 70, "B": 1}, {"A": -1, "B": 1}, {"A": 5, "B": 10}):
        with pytest.raises(gs.ShapeError, match="outside"):
            prof.route(**bad)
    assert len(client.ring.drain()) == 0


@pytest.mark.parametrize("gears", [(1,), (5,), (1, 2, 3), (3, 1000, 4097), (2, TABLE_MAX - 1)])
def test_gear_positions_are_bisect_left_up_to_the_largest_gear(gears: tuple[int, ...]) -> None:
    positions = _positions(gears)
    assert list(positions) == [bisect_left(gears, raw) for raw in range(gears[-1] + 1)]
    with pytest.raises(IndexError):
        positions[gears[-1] + 1]
