"""Snapshot adoption with an attached AdaptiveRunner: swap, warm-up off the request path, grace
before releasing removed gears, ack of the applied version."""

from __future__ import annotations

import operator
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from graphs.fake_device import FakeCuda
from graphs.recording import RecordingBackend

import gearshift as gs
from gearshift.graphs import AdaptiveRunner, Transform
from gearshift.graphs import adaptive as adaptive_module
from gearshift.graphs.backends import CpuBackend
from gearshift.graphs.pool import GraphResourcePool
from gearshift.shm import Kind, Registry
from gearshift.worker import Client, Profile
from worker.fake_controller import WAIT, FakeController, wait_until

H = 4
torch.manual_seed(0)
LAYER = torch.nn.Linear(H, H)
DIMS = {
    "BATCHSIZE": gs.Dim(gears=[2, 4, 8], max=64, splittable=True),
    "SEQLEN": gs.Dim(gears=[8, 16], max=16),
}
INPUTS = {"x": ("B", "S", None), "mask": ("B", "S")}


@torch.no_grad()
def model(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return torch.tanh(LAYER(x)) * mask.unsqueeze(-1)


def call(b: int, s: int) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(b, s, H), "mask": torch.ones(b, s)}


def check(prof: Profile, b: int, s: int) -> None:
    tensors = call(b, s)
    torch.testing.assert_close(prof.run(**tensors), model(**tensors))


@pytest.fixture
def prof(client: Client) -> Profile:
    return client.profile("decode", DIMS, lazy_start=False)  # start-up gears: test_startup


@pytest.fixture
def runner(prof: Profile) -> Iterator[AdaptiveRunner]:
    transform = Transform(model, prof.dims, INPUTS)
    pool = GraphResourcePool(CpuBackend())
    yield prof.attach(AdaptiveRunner(transform, call(1, 1), pool=pool))


def applied(fake: FakeController, client: Client) -> int:
    return fake.registry.slots()[client.slot].applied_version


def test_requests_never_capture_the_swap_thread_warms_up(
    fake: FakeController, client: Client, prof: Profile, runner: AdaptiveRunner
) -> None:
    check(prof, 3, 9)
    assert runner.stats["captures"] == 0 and runner.stats["eager"] == 1 and runner.ready() == []
    client._tick()
    assert runner.ready() == [(b, s) for b in (2, 4, 8) for s in (8, 16)]
    for b, s in [(3, 9), (8, 16), (20, 5)]:  # 20 = 8 + 8 + 4
        check(prof, b, s)
    assert (runner.stats["replays"], runner.stats["eager"], runner.stats["captures"]) == (5, 1, 6)
    drained = fake.drain(client.slot)
    events = drained[~np.isin(drained["kind"], (Kind.MEMORY, Kind.MEASURED, Kind.BUFFERS))]
    assert [e["values"][:2].tolist() for e in events] == [[3, 9], [3, 9], [8, 16], [20, 5]]
    assert events[-1]["chunks"][:2].tolist() == [3, 1] and set(events["kind"]) == {Kind.SHAPE}
    measured = drained[drained["kind"] == Kind.MEASURED]  # per graph captured, one per dim
    assert sorted((int(e["chunks"][0]), int(e["values"][0])) for e in measured) == sorted(
        (i, v[i]) for v in runner.ready() for i in range(2))


@pytest.mark.parametrize("added", [
    {"BATCHSIZE": [1, 2, 4, 8, 12, 16], "SEQLEN": [4, 8, 16]},
    {"BATCHSIZE": [1, 2, 4, 8, 12, 16], "SEQLEN": [4, 8, 12, 16]},
], ids=["one dim", "two dims"])
def test_the_warm_up_has_the_device_capture_the_largest_gears_first(
    fake: FakeController, client: Client, added: dict[str, list[int]]
) -> None:
    """What the device is asked to capture, in order, by a real runner on the cpu backend:
    the largest variant first and none before one that covers it (>= on every dim), in a
    first warm-up over several ticks and in a new snapshot's, also with new gears on two dims
    at once (the dim-by-dim walk this replaced captured (12, 12) before (16, 12))."""
    dims = {"BATCHSIZE": gs.Dim(gears=[1, 2, 4, 8, 16], max=64, splittable=True),
            "SEQLEN": gs.Dim(gears=[4, 8, 16], max=16)}
    prof = client.profile("wide", dims, lazy_start=False)
    backend = RecordingBackend()
    transform = Transform(model, prof.dims, INPUTS)
    prof.attach(AdaptiveRunner(transform, call(1, 1), pool=GraphResourcePool(backend)))

    def captured_largest_first(count: int) -> None:
        order = [shape[:2] for shape in backend.captured]
        assert len(order) == len(set(order)) == count
        for i, v in enumerate(order):
            assert not any(all(map(operator.ge, u, v)) for u in order[i + 1 :]), order

    while not prof.settled:
        client._tick()
    assert backend.captured[0][:2] == (16, 16)
    captured_largest_first(5 * 3)
    backend.captured.clear()
    fake.publish({"wide": added})
    client._tick()
    while not prof.settled:
        client._tick()
    captured_largest_first(len(added["BATCHSIZE"]) * len(added["SEQLEN"]) - 5 * 3)


def test_an_added_gear_runs_on_the_next_larger_one_until_warmed_up(
    fake: FakeController, client: Client, prof: Profile, runner: AdaptiveRunner
) -> None:
    client._tick()
    version = fake.publish({"decode": {"BATCHSIZE": [2, 3, 4, 8], "SEQLEN": [8, 16]}})
    check(prof, 3, 8)  # adopts on the request path: planned at 3, run on the ready (4, 8)
    assert runner.gears["BATCHSIZE"] == (2, 3, 4, 8) and prof.version == version
    assert runner.stats["captures"] == 6 and runner.stats["replays"] == 1
    assert applied(fake, client) < version  # not warmed up yet
    client._tick()
    assert {(3, 8), (3, 16)} <= set(runner.ready()) and runner.stats["captures"] == 8
    assert applied(fake, client) == version
    check(prof, 3, 8)


def test_a_removed_gear_is_released_after_the_requests_started_before(
    fake: FakeController, client: Client, prof: Profile, runner: AdaptiveRunner
) -> None:
    client._tick()
    graphs = len(runner.pool)
    with prof.request(BATCHSIZE=4, SEQLEN=8) as slow:  # a request still running on gear 4
        assert slow.gears == {"BATCHSIZE": 4, "SEQLEN": 8}
        version = fake.publish({"decode": {"BATCHSIZE": [2, 8], "SEQLEN": [8, 16]}})
        client._tick()
        assert prof.version == version and runner.gears["BATCHSIZE"] == (2, 8)
        with prof.request(BATCHSIZE=4, SEQLEN=8) as fresh:  # started on the new snapshot
            assert fresh.gears["BATCHSIZE"] == 8
            client._tick()
        assert (4, 8) in runner.ready() and len(runner.pool) == graphs  # grace
        assert applied(fake, client) < version
    client._tick()
    assert not {(4, 8), (4, 16)} & set(runner.ready()) and len(runner.pool) == graphs - 2
    assert applied(fake, client) == version


def test_a_gear_added_back_during_its_grace_is_kept(
    fake: FakeController, client: Client, prof: Profile, runner: AdaptiveRunner
) -> None:
    client._tick()
    with prof.request(BATCHSIZE=4, SEQLEN=8):
        fake.publish({"decode": {"BATCHSIZE": [2, 8], "SEQLEN": [8, 16]}})
        client._tick()
        fake.publish({"decode": {"BATCHSIZE": [2, 4, 8], "SEQLEN": [8, 16]}})
        client._tick()
    client._tick()
    assert (4, 8) in runner.ready() and len(runner.pool) == 6


def test_grace_holds_across_threads(fake: FakeController, namespace: str) -> None:
    """A request thread inside `request()` while the swap thread adopts a removal."""
    with Client(Registry.attach(namespace), 0, register_timeout=0) as client:
        prof = client.profile("decode", DIMS, lazy_start=False)
        pool = GraphResourcePool(CpuBackend())
        transform = Transform(model, prof.dims, INPUTS)
        runner = prof.attach(AdaptiveRunner(transform, call(1, 1), pool=pool))
        wait_until(lambda: len(runner.ready()) == 6)
        inside, finish = threading.Event(), threading.Event()

        def slow_request() -> None:
            with prof.request(BATCHSIZE=3, SEQLEN=9):
                inside.set()
                finish.wait(WAIT)

        worker = threading.Thread(target=slow_request)
        worker.start()
        assert inside.wait(WAIT)
        version = fake.publish({"decode": {"BATCHSIZE": [2, 8], "SEQLEN": [8, 16]}})
        wait_until(lambda: prof.version == version)
        assert (4, 16) in runner.ready() and len(pool) == 6  # still in flight: kept
        finish.set()
        worker.join(WAIT)
        wait_until(lambda: len(pool) == 4)
        assert (4, 16) not in runner.ready()


def test_the_memory_of_released_graphs_is_in_the_next_reading_the_controller_gets(
    fake: FakeController, client: Client, prof: Profile
) -> None:
    dev = FakeCuda()

    @torch.no_grad()
    def on_device(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = dev.op(lambda a: torch.tanh(LAYER(a)), x)
        return dev.op(lambda a, m: a * m.unsqueeze(-1), h, mask)

    transform = Transform(on_device, prof.dims, INPUTS, outputs=("B", "S", None))
    pool = GraphResourcePool(dev.backend())
    runner = prof.attach(AdaptiveRunner(transform, call(1, 1), pool=pool))
    client._tick()
    assert len(runner.ready()) == 6 and client.memory == runner.backend.mem_get_info
    runner.backend.collect()  # the warm-ups' cache: what is left is the graphs'
    graphs = {pool: dev.pool_bytes(pool) for pool in dev.pools[0] if pool is not None}

    def reading() -> int:
        fake.drain(client.slot)
        client.clock.sleep(client.memory_interval)
        client._tick()
        (record,) = (e for e in fake.drain(client.slot) if e["kind"] == Kind.MEMORY)
        return int(record["values"][0])

    before = reading()
    fake.publish({"decode": {"BATCHSIZE": [2, 8], "SEQLEN": [8, 16]}})
    after = reading()  # that tick adopted, released (no request in flight) and read
    held = [size for pool, size in graphs.items() if pool not in dev.pools[0]]  # gear 4's
    assert len(runner.ready()) == 4 and len(held) == 2 and sum(held) > 0
    assert after - before == sum(held)


def test_runner_builds_and_attaches_and_its_backend_reports_memory(
    fake: FakeController, client: Client, prof: Profile
) -> None:
    with pytest.raises(gs.StateError, match="no runner attached"):
        prof.run(**call(1, 1))
    runner = prof.runner(model, inputs=INPUTS, example=call(1, 1))
    assert runner.gears == prof.gears and client.memory == runner.backend.mem_get_info
    client._tick()
    check(prof, 5, 16)
    kinds = fake.drain(client.slot)["kind"].tolist()
    assert Kind.MEMORY in kinds and Kind.SHAPE in kinds


def test_the_issue_s_mistakes_are_refused_at_runner_or_run_naming_the_input(
    client: Client,
) -> None:
    m = torch.nn.Linear(64, 64)
    p = client.profile("prefill", {"SEQLEN": gs.Dim(max=4096)})
    with pytest.raises(gs.PaddingError, match="select after run"):  # the last token
        p.runner(lambda x: m(x)[-1], {"x": ("S", None)}, {"x": torch.zeros(1, 64)})
    with pytest.raises(gs.ShapeError, match="input 'inp' is not a parameter"):
        p.runner(lambda x: m(x), {"inp": ("S", None)}, {"inp": torch.zeros(1, 64)})
    p.runner(torch.no_grad()(lambda x, n: m(x)[n - 1]), {"x": ("S", None)},
             {"x": torch.zeros(1, 64)}, lengths={"n": "S"})
    x = torch.randn(5, 64)
    with torch.no_grad():
        torch.testing.assert_close(p.run(x=x), m(x)[-1:])
    with pytest.raises(gs.ShapeError, match=r"x must be a torch\.Tensor, got list"):
        p.run(x=[[0.0] * 64])


def test_a_request_checks_its_tensors_once(
    prof: Profile, runner: AdaptiveRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    check_once = runner.transform.check
    monkeypatch.setattr(runner.transform, "check", lambda t: calls.append(1) or check_once(t))
    check(prof, 3, 9)
    assert len(calls) == 1
    with pytest.raises(gs.ShapeError, match="mask"):  # and a bad call still fails up front
        prof.run(x=torch.randn(3, 9, H), mask=torch.ones(3, 8))


def test_a_run_is_counted_in_flight_on_its_gears_until_it_returns_or_raises(
    fake: FakeController, client: Client, prof: Profile, runner: AdaptiveRunner,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Profile.run`'s bracket (inlined `_enter`/`_leave`): the run counts itself on the gears
    in use while its runner runs, uncounts itself when it returns or raises, and wakes the swap
    thread when it was the last on gears replaced meanwhile (their grace is over)."""
    client._tick()
    woken: list[int] = []
    monkeypatch.setattr(client, "_wake", lambda: woken.append(1))
    seen: list[int] = []
    replayed = runner.run

    def run(tensors: dict[str, torch.Tensor], sizes: dict[str, int], route: object) -> object:
        old = prof._in_use
        seen.append(old.active)
        if len(seen) == 1:  # a new snapshot adopted while this run is in flight
            fake.publish({"decode": {"BATCHSIZE": [2, 8], "SEQLEN": [8, 16]}})
            client._refresh()
            assert prof._in_use is not old and old.active == 1
        if len(seen) == 3:
            raise RuntimeError("fn failed")
        return replayed(tensors, sizes, route)

    monkeypatch.setattr(runner, "run", run)
    check(prof, 3, 9)
    assert seen == [1] and woken == [1]  # its gears drained: the swap thread woken once
    check(prof, 3, 9)
    with pytest.raises(RuntimeError, match="fn failed"):
        check(prof, 3, 9)
    assert seen == [1, 1, 1] and prof._in_use.active == 0 and woken == [1]


def test_attach_refuses_a_runner_of_other_dims(prof: Profile) -> None:
    dims = dict(reversed(DIMS.items()))
    transform = Transform(model, dims, INPUTS)
    with pytest.raises(gs.ShapeError, match="in this order"):
        prof.attach(AdaptiveRunner(transform, call(1, 1), pool=GraphResourcePool(CpuBackend())))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_graphs_warm_up_on_the_swap_thread_while_requests_run(
    fake: FakeController, namespace: str
) -> None:
    layer = torch.nn.Linear(H, H).cuda()

    @torch.no_grad()
    def cuda_model(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return torch.tanh(layer(x)) * mask.unsqueeze(-1)

    def cuda_call(b: int, s: int) -> dict[str, torch.Tensor]:
        return {k: v.cuda() for k, v in call(b, s).items()}

    with Client(Registry.attach(namespace), 0, register_timeout=0) as client:
        prof = client.profile("decode", DIMS, lazy_start=False)
        runner = prof.runner(cuda_model, inputs=INPUTS, example=cuda_call(1, 1))

        def request() -> None:
            tensors = cuda_call(3, 9)
            torch.testing.assert_close(prof.run(**tensors), cuda_model(**tensors))

        wait_until(lambda: len(runner.ready()) == 6, request)  # requests run during captures
        version = fake.publish({"decode": {"BATCHSIZE": [2, 8], "SEQLEN": [8, 16]}})
        wait_until(lambda: prof.version == version and len(runner.ready()) == 4)
        request()
        assert runner.stats["replays"] >= 1


def test_gears_released_in_one_tick_give_their_memory_back_in_one_empty_cache(
    fake: FakeController, client: Client, prof: Profile
) -> None:
    """Two gears removed by one snapshot are released in one tick, with one `empty_cache()`
    (each used to run its own: the allocator's other cached blocks went back twice)."""
    dev = FakeCuda()

    @torch.no_grad()
    def on_device(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return dev.op(lambda a, m: torch.tanh(LAYER(a)) * m.unsqueeze(-1), x, mask)

    transform = Transform(on_device, prof.dims, INPUTS, outputs=("B", "S", None))
    runner = prof.attach(AdaptiveRunner(transform, call(1, 1),
                                           pool=GraphResourcePool(dev.backend())))
    client._tick()
    assert len(runner.ready()) == 6
    before = dev.calls["empty_cache"]
    fake.publish({"decode": {"BATCHSIZE": [8], "SEQLEN": [8, 16]}})
    client.clock.sleep(client.memory_interval)
    client._tick()  # adopts, and releases gears 2 and 4 (no request in flight)
    assert runner.ready() == [(8, 8), (8, 16)]
    assert dev.calls["empty_cache"] == before + 1


def test_a_run_replays_the_route_it_was_routed_on_and_the_gears_live_in_one_place(
    fake: FakeController, prof: Profile, runner: AdaptiveRunner,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One lookup: `Profile.run` hands the runner the Route its router found (the runner
    looks nothing up), and the runner's gears are the profile's, not a copy kept in step."""
    assert runner.gears is prof._in_use.gears
    fake.publish({"decode": {"BATCHSIZE": [4, 8], "SEQLEN": [16]}})
    prof.route(BATCHSIZE=1, SEQLEN=1)  # adopts it
    assert runner.gears is prof._in_use.gears and runner.gears["BATCHSIZE"] == (4, 8)
    given: list[object] = []
    run = runner.run
    monkeypatch.setattr(runner, "run", lambda t, s=None, route=None: given.append(route)
                        or run(t, s, route))
    monkeypatch.setattr(adaptive_module, "gear_for", None)  # a lookup of its own would fail
    check(prof, 3, 9)
    (route,) = given
    assert route is prof.route(BATCHSIZE=3, SEQLEN=9) and route.variant == (4, 16)
