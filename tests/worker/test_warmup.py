"""A profile's warm-up against a scripted runner: incremental plans (only the combinations a
new snapshot adds), retries of failed captures, a device's graph cap, and adoption that builds
the new gears in use outside the request lock."""

from __future__ import annotations

import itertools
import logging
import math
import operator
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import pytest
from fakeclock import FakeClock

import gearshift as gs
from gearshift.worker import Client, Profile, warmup
from gearshift.worker import profile as profile_module
from gearshift.worker.warmup import RETRY_SECONDS, WARM_BATCH, largest_first
from worker.fake_controller import FakeController

DIMS = {
    "BATCHSIZE": gs.Dim(gears=list(range(1, 11)), max=64),
    "SEQLEN": gs.Dim(gears=list(range(1, 11)), max=64),
    "HEADS": gs.Dim(gears=list(range(1, 11)), max=64),
}


class ScriptedRunner:
    """The Runner protocol, recording every variant it is asked for; `fail` raise once each,
    `cap` graphs at most."""

    def __init__(self, dims: Mapping[str, gs.Dim], cap: int | None = None) -> None:
        self.gears = {d: s.initial_gears for d, s in dims.items()}
        self.transform: Any = None
        self.asked: list[tuple[int, ...]] = []
        self.captured: set[tuple[int, ...]] = set()
        self.fail: set[tuple[int, ...]] = set()
        self.cap = cap
        self.released: list[tuple[str, int]] = []

    def ready(self) -> list[tuple[int, ...]]:
        return sorted(self.captured)

    def capture(self, variants: Iterable[Mapping[str, int]]) -> int:
        done = 0
        for v in variants:
            key = tuple(v[d] for d in self.gears)
            self.asked.append(key)
            if key in self.fail:
                self.fail.discard(key)
                raise RuntimeError("capture failed")
            if key not in self.captured:
                self.captured.add(key)
                done += 1
        return done

    def release(self, dim: str, gear: int) -> int:
        i = list(self.gears).index(dim)
        gone = {v for v in self.captured if v[i] == gear}
        self.captured -= gone
        self.released.append((dim, gear))
        return len(gone)

    def room(self) -> tuple[int | None, str]:
        return (None if self.cap is None else self.cap - len(self.captured)), "a test cap"

    def run(self, tensors: Mapping[str, Any], sizes: Mapping[str, int] | None = None) -> Any:
        return None


def settle(client: Client, prof: Profile, ticks: int = 10_000) -> int:
    for n in range(1, ticks + 1):
        client._tick()
        if prof.settled:
            return n
    raise AssertionError("not settled")


def test_largest_first_yields_each_combination_once_after_all_that_cover_it() -> None:
    gears = {"A": (1, 2, 4), "B": (8, 16), "C": (1, 3)}
    walk = list(largest_first(gears))
    assert walk[:2] == [(4, 16, 3), (4, 16, 1)]
    assert sorted(walk) == sorted(itertools.product(*gears.values())) and len(set(walk)) == 12
    for i, v in enumerate(walk):
        assert not any(all(map(operator.ge, u, v)) for u in walk[i + 1 :])


def test_the_warm_up_captures_every_variant_after_all_that_cover_it(
    client: Client, fake: FakeController
) -> None:
    """Largest first, asserted on what the runner is asked: the largest combination first,
    and no variant before one that covers it (>= on every dim), also for a new gear's plan
    (mutation caught: `beyond` walking a dim's gears smallest first)."""
    dims = {"BATCHSIZE": gs.Dim(gears=[1, 2, 4], max=64), "SEQLEN": gs.Dim(gears=[1, 16], max=64),
            "HEADS": gs.Dim(gears=[1, 3, 8], max=64)}
    prof = client.profile("p", dims, lazy_start=False)
    runner = prof.attach(ScriptedRunner(dims))

    def check(asked: list[tuple[int, ...]], count: int) -> None:
        assert len(asked) == len(set(asked)) == count
        for i, v in enumerate(asked):
            assert not any(all(map(operator.ge, u, v)) for u in asked[i + 1 :]), (v, asked)

    settle(client, prof)
    assert runner.asked[0] == (4, 16, 8)
    check(runner.asked, 18)
    runner.asked.clear()
    fake.publish({"p": {"BATCHSIZE": [1, 2, 4], "SEQLEN": [1, 8, 16], "HEADS": [1, 3, 8]}})
    settle(client, prof)
    assert runner.asked[0] == (4, 8, 8)
    check(runner.asked, 9)


def test_a_new_gear_plans_only_its_combinations(client: Client, fake: FakeController) -> None:
    prof = client.profile("p", DIMS, lazy_start=False)
    runner = prof.attach(ScriptedRunner(DIMS))
    ticks = settle(client, prof)
    assert len(runner.captured) == 1000 and len(runner.asked) == 1000
    assert ticks == math.ceil(1000 / WARM_BATCH) + 1  # the last tick finds the plan done
    runner.asked.clear()
    gears = {d: [*range(1, 11)] for d in DIMS}
    gears["SEQLEN"] = [*range(1, 11), 20]
    fake.publish({"p": gears})
    settle(client, prof)
    assert len(runner.asked) == 100 and {v[1] for v in runner.asked} == {20}
    gears["SEQLEN"] = [*range(2, 11), 20]  # one removed: nothing to capture, its graphs go
    fake.publish({"p": gears})
    runner.asked.clear()
    settle(client, prof)
    assert runner.asked == [] and runner.released == [("SEQLEN", 1)]
    gears["SEQLEN"] = [*range(1, 11), 20]  # back: its combinations are captured again
    fake.publish({"p": gears})
    settle(client, prof)
    assert len(runner.asked) == 100 and {v[1] for v in runner.asked} == {1}


def test_a_failed_capture_is_retried_later_and_counted(
    client: Client, fake: FakeController
) -> None:
    dims = {"BATCHSIZE": gs.Dim(gears=[1, 2, 4], max=8)}
    prof = client.profile("p", dims, lazy_start=False)
    runner = prof.attach(ScriptedRunner(dims))
    runner.fail = {(2,)}
    settle(client, prof)  # settled: the failed gear runs on a larger graph meanwhile
    assert runner.captured == {(1,), (4,)} and prof.stats["capture_failures"] == 1
    client._tick()
    assert (2,) not in runner.captured and prof.stats["capture_retries"] == 0
    client.clock.sleep(RETRY_SECONDS[0])
    client._tick()
    assert (2,) in runner.captured and prof.stats["capture_retries"] == 1
    client.clock.sleep(RETRY_SECONDS[1])
    client._tick()
    assert prof.stats["capture_retries"] == 1  # nothing left to retry


def test_a_capture_that_always_fails_backs_off_1_2_4_s_then_waits_for_new_gears(
    client: Client, fake: FakeController
) -> None:
    """Tried RETRY_ATTEMPTS times, 1, 2 then 4 s apart on the fake clock, then not at all until
    the gears change, then again (mutations caught: `<=` for `<` in the attempts bound, waits
    not doubling, the attempts not reset by new gears)."""
    assert warmup.RETRY_ATTEMPTS == 4 and RETRY_SECONDS[0] == 1.0
    tried: list[float] = []

    class Failing(ScriptedRunner):
        def capture(self, variants: Iterable[Mapping[str, int]]) -> int:
            variants = list(variants)
            if [v["BATCHSIZE"] for v in variants] == [2]:
                tried.append(client.clock.now())
                raise RuntimeError("capture failed")
            return super().capture(variants)

    dims = {"BATCHSIZE": gs.Dim(gears=[1, 2, 4], max=8)}
    prof = client.profile("p", dims, lazy_start=False)
    runner = prof.attach(Failing(dims))
    settle(client, prof)
    for _ in range(4 * 120):  # two minutes in quarter seconds, far beyond the last wait
        client.clock.sleep(0.25)
        client._tick()
    assert [t - tried[0] for t in tried] == pytest.approx([0.0, 1.0, 3.0, 7.0])
    assert prof.stats["capture_failures"] == 4 and prof.stats["capture_retries"] == 3
    fake.publish({"p": {"BATCHSIZE": [1, 2, 4, 8]}})  # new gears: (2,) is tried again
    settle(client, prof)
    for _ in range(4):
        client._tick()
    assert len(tried) == 5 and (8,) in runner.captured


def test_a_capture_failing_on_every_retry_is_logged_once_with_its_reason(
    client: Client, fake: FakeController, caplog: pytest.LogCaptureFixture
) -> None:
    class Failing(ScriptedRunner):
        def capture(self, variants: Iterable[Mapping[str, int]]) -> int:
            raise TypeError("<lambda>() got an unexpected keyword argument 'inp'")

    dims = {"BATCHSIZE": gs.Dim(gears=[1, 2], max=8)}
    prof = client.profile("p", dims, lazy_start=False)
    prof.attach(Failing(dims))
    with caplog.at_level(logging.WARNING, "gearshift"):
        settle(client, prof)
        for _ in range(6):
            client.clock.sleep(RETRY_SECONDS[1])
            client._tick()
    assert prof.stats["capture_failures"] == 2 * warmup.RETRY_ATTEMPTS
    [warned] = caplog.records  # one line, its reason, no traceback (that is at debug level)
    assert "unexpected keyword argument 'inp'" in warned.getMessage() and not warned.exc_info


def test_a_full_device_stops_the_plan_once_and_still_settles(
    client: Client, fake: FakeController, caplog: pytest.LogCaptureFixture
) -> None:
    dims = {"BATCHSIZE": gs.Dim(gears=[1, 2, 4, 8], max=8), "SEQLEN": gs.Dim(gears=[1, 2], max=8)}
    prof = client.profile("p", dims, lazy_start=False)
    runner = prof.attach(ScriptedRunner(dims, cap=6))
    settle(client, prof)
    assert len(runner.captured) == 6 and prof.stats["graph_limits"] == 1
    assert "a test cap" in caplog.text and "8 combinations" in caplog.text
    for _ in range(3):
        client._tick()
    assert prof.stats["graph_limits"] == 1 and len(runner.asked) == 6
    fake.publish({"p": {"BATCHSIZE": [1, 2, 4], "SEQLEN": [1, 2]}})  # 8 goes: room again
    settle(client, prof)
    assert runner.released == [("BATCHSIZE", 8)]
    assert runner.captured == set(itertools.product((1, 2, 4), (1, 2)))


def test_adopt_builds_the_new_gears_in_use_outside_the_request_lock(
    client: Client, fake: FakeController, monkeypatch: pytest.MonkeyPatch
) -> None:
    prof = client.profile("p", {"BATCHSIZE": gs.Dim(gears=[1, 2, 4], max=8)})
    built = threading.Event()
    made = profile_module._InUse

    def spy(*args: Any) -> Any:
        built.set()
        return made(*args)

    monkeypatch.setattr(profile_module, "_InUse", spy)
    inside, go = threading.Event(), threading.Event()

    def request_thread() -> None:
        with prof._lock:  # a request counting itself in holds the lock a while
            inside.set()
            go.wait(10)

    version = fake.publish({"p": {"BATCHSIZE": [1, 8]}})
    thread = threading.Thread(target=request_thread)
    thread.start()
    assert inside.wait(10)
    adopting = threading.Thread(target=client._refresh)
    adopting.start()
    try:
        assert built.wait(10)  # built while the request thread holds the lock ...
        assert prof.version != version  # ... and swapped only once it is free
    finally:
        go.set()
        thread.join(10)
        adopting.join(10)
    assert prof.version == version and prof.gears == {"BATCHSIZE": (1, 8)}


def test_a_plan_the_cap_stopped_resumes_when_a_release_after_its_grace_makes_room(
    client: Client, fake: FakeController
) -> None:
    dims = {"BATCHSIZE": gs.Dim(gears=[1, 2, 4, 8], max=8), "SEQLEN": gs.Dim(gears=[1, 2], max=8)}
    prof = client.profile("p", dims, lazy_start=False)
    runner = prof.attach(ScriptedRunner(dims, cap=6))
    settle(client, prof)
    with prof.request(BATCHSIZE=8, SEQLEN=1):  # in flight on 8: its graphs stay meanwhile
        fake.publish({"p": {"BATCHSIZE": [1, 2, 4], "SEQLEN": [1, 2]}})
        client._tick()
        assert runner.released == [] and prof.stats["graph_limits"] == 2 and not prof.settled
    settle(client, prof)
    assert runner.released == [("BATCHSIZE", 8)]
    assert runner.captured == set(itertools.product((1, 2, 4), (1, 2)))


# The start-up gears and the variants requests wanted (`WarmUp` driven by hand)

TWO = {"BATCHSIZE": gs.Dim(gears=[1, 2, 4], max=8), "SEQLEN": gs.Dim(gears=[8, 16], max=16)}


class WantingRunner(ScriptedRunner):
    """A runner that remembers what its requests found not ready (`take_wanted`)."""

    def __init__(self, dims: Mapping[str, gs.Dim]) -> None:
        super().__init__(dims)
        self.wanted: list[tuple[int, ...]] = []

    def take_wanted(self) -> list[tuple[int, ...]]:
        out, self.wanted = self.wanted, []
        return out


def stepped(warm: warmup.WarmUp, runner: ScriptedRunner, gears: Mapping[str, Any],
            in_use: object, steps: int = 5) -> None:
    for _ in range(steps):
        warm.step(runner, in_use, gears, 0)


def test_a_fresh_profile_captures_its_largest_variant_and_defers_the_other_start_up_gears(
) -> None:
    warm, runner = warmup.WarmUp("p", TWO, True, FakeClock()), WantingRunner(TWO)
    gears, in_use = {d: tuple(s.initial_gears) for d, s in TWO.items()}, object()
    stepped(warm, runner, gears, in_use)
    assert runner.ready() == [(4, 16)] and warm.settled(in_use)
    runner.wanted = [(2, 16), (1, 8)]  # requests found these not ready
    stepped(warm, runner, gears, in_use)
    assert runner.ready() == [(1, 8), (2, 16), (4, 16)] and warm.settled(in_use)
    runner.wanted = [(3, 16)]  # not a gear in use: never captured
    stepped(warm, runner, gears, in_use)
    assert (3, 16) not in runner.asked
    eager = warmup.WarmUp("p", TWO, False, FakeClock())  # lazy_start=False: all at once
    stepped(eager, runner := WantingRunner(TWO), gears, in_use)
    assert len(runner.ready()) == 6
    blind = warmup.WarmUp("p", TWO, True, FakeClock())  # a runner without take_wanted
    stepped(blind, runner := ScriptedRunner(TWO), gears, in_use)
    assert len(runner.ready()) == 6  # defers nothing: no request could ask for the rest


def test_a_start_up_gear_a_snapshot_keeps_stays_deferred_one_it_drops_does_not() -> None:
    warm, runner = warmup.WarmUp("p", TWO, True, FakeClock()), WantingRunner(TWO)
    first = {d: tuple(s.initial_gears) for d, s in TWO.items()}
    stepped(warm, runner, first, object())
    kept = {"BATCHSIZE": (1, 2, 4), "SEQLEN": (8, 16)}
    warm.startup.adopted(kept)  # a snapshot that keeps every start-up gear
    stepped(warm, runner, kept, object())
    assert runner.ready() == [(4, 16)]
    dropped = {"BATCHSIZE": (2, 3, 4), "SEQLEN": (16,)}  # 1 and 8 dropped, 3 new
    warm.startup.adopted(dropped)
    warm.startup.adopted(first)  # and back: 1 and 8 are ordinary gears for good
    stepped(warm, runner, first, object())
    assert runner.ready() == [(1, 8), (1, 16), (4, 8), (4, 16)]  # 2 is still a start-up gear


def test_the_wanted_variants_held_are_bounded() -> None:
    warm, runner = warmup.WarmUp("p", TWO, True, FakeClock()), WantingRunner(TWO)
    runner.wanted = [(1, g) for g in range(warmup.MAX_HELD + 10)]
    assert len(warm.startup.collect(runner)) == warmup.MAX_HELD
