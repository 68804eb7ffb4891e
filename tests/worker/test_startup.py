"""Lazy capture of start-up gears: a fresh profile captures only its largest gears, a request
between start-up gears runs padded and gets its own graph on the next maintain, gears the
controller adds (or adds back) are captured at adoption, and `lazy_start=False` captures all."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from types import SimpleNamespace

import pytest

import gearshift as gs
from gearshift.graphs import AdaptiveRunner, Transform
from gearshift.graphs.backends import CpuBackend
from gearshift.graphs.pool import GraphResourcePool
from gearshift.shm import Kind
from gearshift.worker import Client, Profile, warmup
from gearshift.worker.warmup import RETRY_SECONDS, WARM_BATCH, WARM_WALK, StartupGears, defers
from worker.fake_controller import FakeController
from worker.test_adoption import DIMS, INPUTS, call, check, model
from worker.test_warmup import ScriptedRunner, settle

LADDER = {"B": gs.Dim(max=64)}  # 1, 2, 4, ..., 64
WANTING = SimpleNamespace(take_wanted=list)  # a runner that says what requests wanted


def attach(prof: Profile) -> AdaptiveRunner:
    transform = Transform(model, prof.dims, INPUTS)
    pool = GraphResourcePool(CpuBackend())
    return prof.attach(AdaptiveRunner(transform, call(1, 1), pool=pool))


@pytest.fixture
def prof(client: Client) -> Profile:
    return client.profile("decode", DIMS)


@pytest.fixture
def runner(prof: Profile) -> Iterator[AdaptiveRunner]:
    yield attach(prof)


def applied(fake: FakeController, client: Client) -> int:
    return fake.registry.slots()[client.slot].applied_version


def measured(fake: FakeController, client: Client) -> set[tuple[int, int]]:
    """(dim index, gear) of the MEASURED records the client wrote since the last drain."""
    drained = fake.drain(client.slot)
    records = drained[drained["kind"] == Kind.MEASURED]
    return {(int(r["chunks"][0]), int(r["values"][0])) for r in records}


def test_the_start_up_rules() -> None:
    gears = StartupGears(DIMS, lazy=True)
    held = {"BATCHSIZE": (2, 4, 8), "SEQLEN": (8, 16)}
    deferred = gears.deferred(held, WANTING)
    assert deferred == (frozenset({2, 4}), frozenset({8}))  # the largest gears are captured
    assert not defers((8, 16), deferred) and defers((8, 8), deferred) and defers((2, 16), deferred)
    gears.adopted({"BATCHSIZE": (2, 8, 12), "SEQLEN": (8, 16)})  # 4 leaves for good
    gears.adopted({"BATCHSIZE": (2, 4, 8, 12), "SEQLEN": (8, 16)})
    now = gears.deferred({"BATCHSIZE": (2, 4, 8, 12), "SEQLEN": (8, 16)}, WANTING)
    assert now == (frozenset({2, 8}), frozenset({8}))  # 8 is no longer the largest
    none = (frozenset(), frozenset())
    assert StartupGears(DIMS, lazy=False).deferred(held, WANTING) == none
    assert gears.deferred(held, object()) == none  # a runner that cannot say what was wanted


def test_a_fresh_profile_captures_only_the_largest_gears_at_once(
    fake: FakeController, client: Client, prof: Profile, runner: AdaptiveRunner
) -> None:
    version = fake.publish({"decode": {"BATCHSIZE": [2, 4, 8], "SEQLEN": [8, 16]}})
    client._tick()
    assert runner.ready() == [(8, 16)] and runner.stats["captures"] == 1
    assert prof.settled and applied(fake, client) == version
    assert measured(fake, client) == {(0, 8), (1, 16)}  # every graph captured is measured


def test_a_request_between_start_up_gears_runs_padded_then_gets_its_graph(
    fake: FakeController, client: Client, prof: Profile, runner: AdaptiveRunner
) -> None:
    client._tick()
    fake.drain(client.slot)
    check(prof, 3, 9)  # (4, 16) is not captured: padded to (8, 16), never eager
    assert runner.stats["replays"] == 1 and runner.stats["eager"] == 0
    assert runner.ready() == [(8, 16)]  # the request path never captures
    client._tick()
    assert runner.ready() == [(4, 16), (8, 16)] and runner.stats["captures"] == 2
    assert prof.settled and measured(fake, client) == {(0, 4), (1, 16)}
    check(prof, 3, 9)
    client._tick()
    assert runner.stats["captures"] == 2 and runner.stats["replays"] == 2  # once is enough


def test_a_gear_the_controller_adds_is_captured_at_adoption(
    fake: FakeController, client: Client, prof: Profile, runner: AdaptiveRunner
) -> None:
    client._tick()
    version = fake.publish({"decode": {"BATCHSIZE": [2, 3, 4, 8], "SEQLEN": [8, 16]}})
    client._tick()
    assert runner.ready() == [(3, 16), (8, 16)]  # (3, 8) holds the start-up gear 8 of SEQLEN
    assert prof.settled and applied(fake, client) == version


def test_a_start_up_gear_dropped_and_added_back_is_captured_at_adoption(
    fake: FakeController, client: Client, prof: Profile, runner: AdaptiveRunner
) -> None:
    client._tick()
    fake.publish({"decode": {"BATCHSIZE": [2, 8], "SEQLEN": [8, 16]}})
    client._refresh()  # adopted on a request thread: no step saw it
    fake.publish({"decode": {"BATCHSIZE": [2, 4, 8], "SEQLEN": [8, 16]}})
    client._tick()
    assert runner.ready() == [(4, 16), (8, 16)] and prof.settled  # 4: an ordinary gear now
    fake.publish({"decode": {"BATCHSIZE": [2, 4], "SEQLEN": [8, 16]}})  # 8 goes: 4 is largest
    client._tick()
    client._tick()
    assert runner.ready() == [(4, 16)] and prof.settled


def test_lazy_start_off_captures_every_start_up_gear_at_once(client: Client) -> None:
    prof = client.profile("decode", DIMS, lazy_start=False)
    runner = attach(prof)
    client._tick()
    assert runner.ready() == [(b, s) for b in (2, 4, 8) for s in (8, 16)]
    check(prof, 3, 9)
    assert runner.stats["replays"] == 1 and prof.settled


def test_a_runner_that_cannot_say_what_was_wanted_gets_every_gear_at_once(
    client: Client,
) -> None:
    prof = client.profile("p", LADDER)
    runner = prof.attach(ScriptedRunner(LADDER))  # no take_wanted
    settle(client, prof)
    assert runner.captured == {(g,) for g in LADDER["B"].initial_gears}


class WantingRunner(ScriptedRunner):
    """A ScriptedRunner with `take_wanted`: its requests wanted the variants given to `want`."""

    def __init__(self, dims: Mapping[str, gs.Dim], cap: int | None = None) -> None:
        super().__init__(dims, cap)
        self.wanted: list[tuple[int, ...]] = []

    def want(self, *variants: tuple[int, ...]) -> None:
        self.wanted += variants

    def take_wanted(self) -> list[tuple[int, ...]]:
        out, self.wanted = self.wanted, []
        return out


def test_a_huge_product_is_walked_a_bounded_slice_a_step(
    client: Client, fake: FakeController
) -> None:
    """3 dims x 30 gears: 27,000 variants, all deferred but the largest; each step looks at
    WARM_WALK of them at most, so the swap thread stays responsive (mutation caught: no bound
    on the walk settles in one step). A snapshot of the same gears is not walked again."""
    dims = {d: gs.Dim(gears=list(range(1, 31)), max=64) for d in ("A", "B", "C")}
    prof = client.profile("p", dims)
    runner = prof.attach(WantingRunner(dims))
    assert settle(client, prof) == math.ceil(30**3 / WARM_WALK)
    assert runner.captured == {(30, 30, 30)}
    version = fake.publish({"p": {d: list(range(1, 31)) for d in dims}})
    assert settle(client, prof) == 1 and applied(fake, client) == version


def test_wanted_captures_are_bounded_per_call_and_retried_when_they_fail(
    client: Client,
) -> None:
    dims = {"B": gs.Dim(gears=list(range(1, 31)), max=64)}
    prof = client.profile("p", dims)
    runner = prof.attach(WantingRunner(dims))
    settle(client, prof)
    assert runner.captured == {(30,)}
    runner.fail = {(3,)}
    runner.want(*((g,) for g in range(1, WARM_BATCH + 4)), (30,), (99,))  # 99: not held
    client._tick()
    assert len(runner.captured) == 1 + WARM_BATCH and not prof.settled
    client._tick()
    assert prof.settled and prof.stats["capture_failures"] == 1
    assert runner.captured == {(30,), *((g,) for g in range(1, WARM_BATCH + 4) if g != 3)}
    client.clock.sleep(RETRY_SECONDS[0])
    client._tick()
    assert (3,) in runner.captured and prof.stats["capture_retries"] == 1
    assert (99,) not in runner.asked and runner.asked.count((30,)) == 1  # ready: not again


def test_wanted_variants_are_held_at_most_max_held(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(warmup, "MAX_HELD", 3)
    prof = client.profile("p", LADDER)
    runner = prof.attach(WantingRunner(LADDER))
    settle(client, prof)
    runner.want((1,), (2,), (4,), (8,))
    client._tick()
    assert runner.captured == {(64,), (1,), (2,), (4,)} and (8,) not in runner.asked
    runner.want((8,))  # a later request wants it again
    client._tick()
    assert (8,) in runner.captured


def test_a_full_device_drops_the_wanted_variants(client: Client) -> None:
    prof = client.profile("p", LADDER)
    runner = prof.attach(WantingRunner(LADDER, cap=3))
    settle(client, prof)
    runner.want((1,), (2,), (4,), (8,))
    client._tick()
    assert runner.captured == {(64,), (1,), (2,)} and prof.stats["graph_limits"] == 1
    assert prof.settled and (4,) not in runner.asked  # they run on larger graphs
    runner.want((8,))
    client._tick()
    assert (8,) not in runner.asked and prof.stats["graph_limits"] == 1  # logged once


def test_a_start_up_gear_that_becomes_the_largest_is_captured_at_adoption(
    client: Client, fake: FakeController
) -> None:
    prof = client.profile("p", LADDER)
    runner = prof.attach(WantingRunner(LADDER))
    settle(client, prof)
    assert runner.captured == {(64,)}
    fake.publish({"p": {"B": [1, 2, 4, 8, 16]}})
    settle(client, prof)
    assert runner.captured == {(16,)} and runner.released == [("B", 32), ("B", 64)]
