"""The request path's bounds: a request never builds more chunks than a record counts."""

from __future__ import annotations

import gearshift as gs
from gearshift.shm import Kind
from gearshift.worker import Client
from gearshift.worker.routing import MAX_CHUNKS

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
