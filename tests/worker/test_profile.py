"""Routing on a profile: routes, recorded events, adoption of new gears, bad shapes."""

from __future__ import annotations

import gc
import itertools
import logging
import pickle
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gearshift as gs
from gearshift.core.dims import chunks_for
from gearshift.shm import Kind
from gearshift.worker import Client, Profile, Route
from worker.fake_controller import FakeController

DIMS = {
    "BATCHSIZE": gs.Dim(gears=[1, 2, 4, 8, 16, 32, 64], splittable=True),
    "SEQLEN": gs.Dim(min=1, max=8192, align=16),
}


@pytest.fixture
def prof(client: Client) -> Profile:
    return client.profile("decode", DIMS)


def test_route_plans_the_smallest_gear_and_splits_over_the_largest(prof: Profile) -> None:
    assert prof.gears == {
        "BATCHSIZE": (1, 2, 4, 8, 16, 32, 64),
        "SEQLEN": tuple(1 << k for k in range(14)),
    }
    route = prof.route(BATCHSIZE=13, SEQLEN=700)
    assert route.gears == {"BATCHSIZE": 16, "SEQLEN": 1024} and not route.eager
    assert route.chunks == {"BATCHSIZE": (16,), "SEQLEN": (1024,)}
    route = prof.route(BATCHSIZE=130, SEQLEN=8192)
    assert route.chunks == {"BATCHSIZE": (64, 64, 2), "SEQLEN": (8192,)}
    assert route.gears == {"BATCHSIZE": 64, "SEQLEN": 8192}
    assert prof.route(BATCHSIZE=np.int64(64), SEQLEN=1).chunks["BATCHSIZE"] == (64,)


def test_dims_with_large_gears_route_by_bisection(client: Client) -> None:
    prof = client.profile("long", {"SEQLEN": gs.Dim(gears=[1000, 200_000], max=1 << 20)})
    assert prof.route(SEQLEN=150_000).chunks == {"SEQLEN": (200_000,)}
    assert prof.route(SEQLEN=1000).chunks == {"SEQLEN": (1000,)}
    assert prof.route(SEQLEN=999_999).eager


def test_routing_tables_give_a_collection_nothing_to_walk(prof: Profile) -> None:
    # a collection walks every tracked container, inside whichever request sets it off: no
    # routing structure may hold one reference per raw value (8193 for SEQLEN here)
    tracked = [obj for row in prof._in_use.table for obj in row if gc.is_tracked(obj)]
    assert max((len(gc.get_referents(obj)) for obj in tracked), default=0) <= len(
        prof.gears["SEQLEN"])


def test_route_records_one_event_per_request(
    fake: FakeController, client: Client, prof: Profile
) -> None:
    fake.drain(client.slot)
    prof.route(BATCHSIZE=13, SEQLEN=700)
    prof.route(BATCHSIZE=130, SEQLEN=5)
    first, second = fake.drain(client.slot)
    assert (first["kind"], first["profile"], first["version"], first["ndim"]) == (
        Kind.SHAPE,
        prof.id,
        prof.version,
        2,
    )
    assert first["values"].tolist()[:2] == [13, 700] and first["chunks"].tolist()[:2] == [1, 1]
    assert second["values"].tolist()[:2] == [130, 5] and second["chunks"].tolist()[:2] == [3, 1]
    assert first["t_ns"] == client.clock.now_ns()


def test_non_splittable_overflow_runs_eager_and_is_recorded_so(
    fake: FakeController, client: Client
) -> None:
    prof = client.profile("prefill", {"SEQLEN": gs.Dim(gears=[16, 64], max=100)})
    route = prof.route(SEQLEN=80)
    assert route.eager and route.chunks == {"SEQLEN": ()} and route.gears == {"SEQLEN": None}
    (event,) = fake.drain(client.slot)
    assert event["kind"] == Kind.EAGER and event["chunks"][0] == 0


@pytest.mark.parametrize(
    "sizes, message",
    [
        ({"BATCHSIZE": 0, "SEQLEN": 1}, r"decode: BATCHSIZE=0 is outside \[1, 8192\]"),
        ({"BATCHSIZE": -3, "SEQLEN": 1}, r"BATCHSIZE=-3 is outside"),
        ({"BATCHSIZE": 1, "SEQLEN": 8193}, r"SEQLEN=8193 is outside \[1, 8192\]"),
        ({"BATCHSIZE": 1, "SEQLEN": 1, "HEADS": 2}, r"unknown \['HEADS'\], missing \[\]"),
        ({"BATCHSIZE": 1}, r"unknown \[\], missing \['SEQLEN'\]"),
        ({"BATCHSIZE": 1, "SEQLN": 4}, r"unknown \['SEQLN'\], missing \['SEQLEN'\]"),
        ({"BATCHSIZE": 2.0, "SEQLEN": 1}, r"BATCHSIZE=2.0: expected an int"),
        ({"BATCHSIZE": True, "SEQLEN": 1}, r"BATCHSIZE=True: expected an int"),
    ],
)
def test_bad_shapes_are_clear_errors_and_record_nothing(
    fake: FakeController, client: Client, prof: Profile, sizes: dict, message: str
) -> None:
    fake.drain(client.slot)
    with pytest.raises(gs.ShapeError, match=message):
        prof.route(**sizes)
    with pytest.raises(gs.ShapeError), prof.request(**sizes):
        pass
    assert len(fake.drain(client.slot)) == 0
    assert prof._in_use.active == 0  # nor is it left in flight (its gears' graphs would stay)


def test_a_new_snapshot_is_adopted_on_the_next_route(
    fake: FakeController, client: Client, prof: Profile
) -> None:
    before = prof.version
    version = fake.publish({"decode": {"BATCHSIZE": [8, 24, 64], "SEQLEN": [512, 8192]}})
    assert version > before and prof.version == before  # nothing reads it before a request
    route = prof.route(BATCHSIZE=13, SEQLEN=700)
    assert route.version == prof.version == version
    assert route.gears == {"BATCHSIZE": 24, "SEQLEN": 8192}
    assert prof.gears == {"BATCHSIZE": (8, 24, 64), "SEQLEN": (512, 8192)}
    fake.drain(client.slot)
    prof.route(BATCHSIZE=1, SEQLEN=1)
    assert fake.drain(client.slot)[0]["version"] == version


def test_snapshots_without_valid_gears_for_the_profile_keep_its_gears(
    fake: FakeController, prof: Profile
) -> None:
    gears = prof.gears
    for payload in (
        {"other": {"X": [1]}},  # the profile is not in it (yet)
        {"decode": {"BATCHSIZE": [1, 9000], "SEQLEN": [8]}},  # 9000 > BATCHSIZE.max
        {"decode": {"BATCHSIZE": [1]}},  # a dim missing
        {"decode": {"BATCHSIZE": [], "SEQLEN": [8]}},  # no gear
    ):
        version = fake.publish(payload)
        assert prof.route(BATCHSIZE=3, SEQLEN=3).version == version
        assert prof.gears == gears


@pytest.mark.parametrize(
    "payload",
    [5, {"profiles": []}, {"profiles": {"decode": None}}, {"profiles": {"decode": {"gears": [1]}}}],
)
def test_malformed_snapshots_never_reach_the_request_path(
    fake: FakeController, prof: Profile, payload: object
) -> None:
    gears = prof.gears
    version = fake.region.publish(payload)
    assert prof.route(BATCHSIZE=3, SEQLEN=3).version == version and prof.gears == gears


def test_profile_dims_are_validated(client: Client) -> None:
    with pytest.raises(gs.ShapeError, match="1 to 4 dims"):
        client.profile("none", {})
    with pytest.raises(gs.ShapeError, match="1 to 4 dims"):
        client.profile("five", {f"D{i}": gs.Dim() for i in range(5)})
    with pytest.raises(gs.ShapeError, match="must name a gs\\.Dim"):
        client.profile("bad", {"B": [1, 2]})
    with pytest.raises(gs.ShapeError, match="non-empty string"):
        client.profile("", {"B": gs.Dim()})
    with pytest.raises(gs.ShapeError, match="does not fit 64 bits"):
        client.profile("huge", {"B": gs.Dim(max=1 << 63)})


def test_the_same_name_gives_the_same_profile(client: Client, prof: Profile) -> None:
    assert client.profile("decode", dict(DIMS)) is prof
    with pytest.raises(gs.ProfileMismatch, match="other dims") as e:
        client.profile("decode", {"BATCHSIZE": gs.Dim()})
    assert "(BATCHSIZE=Dim(gears=(1, 2, 4" in str(e.value)  # the known dims, then the new ones
    assert "this call declares BATCHSIZE=Dim(gears=None" in str(e.value)


def test_gears_sorted_or_de_duplicated_are_logged_once(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    dims = {"SEQLEN": gs.Dim(gears=[8, 2, 2], max=16), "BATCHSIZE": gs.Dim(gears=[1, 4])}
    with caplog.at_level(logging.WARNING, "gearshift"):
        client.profile("sorted", dims)
        client.profile("sorted", dims)
    notes = [r.getMessage() for r in caplog.records if "de-duplicated" in r.getMessage()]
    assert notes == ["profile 'sorted': SEQLEN gears [8, 2, 2] were sorted and de-duplicated"
                     " to [2, 8]"]


# every branch of the request path against the rules it follows

SMALL = {  # min > 1, splits, eager: every branch of the request path within a few values
    "B": gs.Dim(gears=[2, 8], max=20, splittable=True),
    "S": gs.Dim(gears=[16, 64], min=4, max=100),
}
_size = st.one_of(
    st.integers(-2, 110),
    st.integers(-2, 110).map(np.int64),
    st.sampled_from([2.0, True, None, "8", 1 << 70]),
)
_sizes = st.dictionaries(st.sampled_from(["B", "S", "X", "_unknown"]), _size, max_size=4)


def _outcome(route, fake: FakeController, slot: int, sizes: dict) -> tuple:
    """What one route call gives back (its Route or its error) and records."""
    try:
        result = route(**sizes)
    except gs.ShapeError as e:
        result = str(e)
    events = fake.drain(slot)
    return result, [(e["values"].tolist(), e["chunks"].tolist(), e["kind"]) for e in events]


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sizes=_sizes | st.fixed_dictionaries({"B": _size, "S": _size}))
def test_route_plans_records_and_fails_by_the_dims_rules(
    fake: FakeController, client: Client, sizes: dict
) -> None:
    prof = client.profile("small", SMALL)
    result, events = _outcome(prof.route, fake, client.slot, sizes)
    valid = set(sizes) == set(SMALL) and all(
        type(sizes[d]) in (int, np.int64) and SMALL[d].min <= sizes[d] <= SMALL[d].max
        for d in SMALL
    )
    if not valid:
        assert isinstance(result, str) and events == []  # a ShapeError, nothing recorded
        return
    chunks = {d: chunks_for(prof.gears[d], int(sizes[d]), SMALL[d].splittable) for d in SMALL}
    assert (result.version, dict(result.chunks)) == (prof.version, chunks)
    kind = Kind.SHAPE if all(chunks.values()) else Kind.EAGER
    counts = [len(c) for c in chunks.values()]
    assert events == [([int(sizes["B"]), int(sizes["S"]), 0, 0], [*counts, 0, 0], kind)]


def test_every_gear_combination_of_three_dims_routes_to_its_own_gears(client: Client) -> None:
    # gear counts 3, 2, 4: each dim's gear position is its own digit of the Routes' key
    dims = {
        "A": gs.Dim(gears=[2, 4, 8]), "B": gs.Dim(gears=[3, 9]), "C": gs.Dim(gears=[1, 2, 5, 7])
    }
    prof = client.profile("three", dims)
    shared: dict[tuple, Route] = {}
    for sizes in itertools.product(range(1, 9), range(1, 10), range(1, 8)):
        named = dict(zip(dims, sizes, strict=True))
        route = prof.route(**named)
        want = {d: chunks_for(prof.gears[d], raw, False) for d, raw in named.items()}
        assert dict(route.chunks) == want
        assert shared.setdefault(tuple(want.values()), route) is route  # one per combination
    assert len(shared) == 3 * 2 * 4


def test_routes_of_one_gear_combination_are_shared_and_read_only(
    fake: FakeController, prof: Profile
) -> None:
    route = prof.route(BATCHSIZE=13, SEQLEN=700)
    assert prof.route(BATCHSIZE=9, SEQLEN=513) is route
    with prof.request(BATCHSIZE=16, SEQLEN=1024) as same:
        assert same is route
    with pytest.raises(TypeError):
        route.chunks["BATCHSIZE"] = (8,)  # type: ignore[index]
    assert pickle.loads(pickle.dumps(route)) == route  # it can go to another process
    assert route.variant == (16, 1024)  # the one graph it runs, in dim order
    split = prof.route(BATCHSIZE=130, SEQLEN=700)
    assert split.chunks["BATCHSIZE"] == (64, 64, 2) and split.variant is None
    assert pickle.loads(pickle.dumps(split)) == split
    version = fake.publish({"decode": {"BATCHSIZE": [16, 64], "SEQLEN": [1024, 8192]}})
    again = prof.route(BATCHSIZE=13, SEQLEN=700)
    assert again is not route and again.version == version and again.chunks == route.chunks


@pytest.mark.parametrize("names", [("seq-len", "class"), ("_B", "S"), ("\ufb01", "S")])
def test_dims_named_unlike_parameters_route(
    fake: FakeController, client: Client, names: tuple[str, str]
) -> None:
    # "\ufb01" (the fi ligature) is an identifier that Python would normalise to "fi"
    prof = client.profile("odd", {names[0]: gs.Dim(gears=[4, 8]), names[1]: gs.Dim()})
    fake.drain(client.slot)
    assert prof.route(**{names[0]: 3, names[1]: 5}).gears == {names[0]: 4, names[1]: 8}
    with pytest.raises(gs.ShapeError, match="missing"):
        prof.route(**{names[0]: 3})
    assert fake.drain(client.slot)["values"][:, :2].tolist() == [[3, 5]]


def test_route_takes_keywords_only(prof: Profile) -> None:
    with pytest.raises(TypeError):
        prof.route(13, 700)  # type: ignore[misc]


def test_snapshot_gears_in_another_dim_order_are_recorded_in_the_profile_order(
    fake: FakeController, client: Client, prof: Profile
) -> None:
    fake.publish({"decode": {"SEQLEN": [512, 8192], "BATCHSIZE": [8, 64]}})
    assert prof.route(BATCHSIZE=72, SEQLEN=700).chunks == {
        "BATCHSIZE": (64, 8),
        "SEQLEN": (8192,),
    }
    prof.route(BATCHSIZE=3, SEQLEN=5)
    fake.drain(client.slot)
    prof.route(BATCHSIZE=72, SEQLEN=700)
    prof.route(BATCHSIZE=3, SEQLEN=5)
    events = fake.drain(client.slot)
    assert events["values"][:, :2].tolist() == [[72, 700], [3, 5]]
    assert events["chunks"][:, :2].tolist() == [[2, 1], [1, 1]]


def test_request_threads_routing_at_once_lose_no_event(
    fake: FakeController, client: Client, prof: Profile
) -> None:
    fake.drain(client.slot)
    threads, calls = 4, 3000  # 12000 events: the default ring holds them all

    def work(t: int) -> None:
        for i in range(calls):
            prof.route(BATCHSIZE=1 + t, SEQLEN=1 + i)
            if i % 500 == 0:
                prof.route(BATCHSIZE=65 + t, SEQLEN=1 + i)  # a split, on the generic path

    workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    events = fake.drain(client.slot)
    per_thread = threads * (calls + calls // 500)
    assert len(events) == per_thread and client.ring.dropped == 0
    got = sorted(map(tuple, events["values"][:, :2].tolist()))
    expected = sorted(
        (b + t, 1 + i)
        for t in range(threads)
        for i in range(calls)
        for b in ((1, 65) if i % 500 == 0 else (1,))
    )
    assert got == expected
