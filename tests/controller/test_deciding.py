"""Decision rounds off the loop: a slow round never stops the loop from beating and draining,
and a round decided on gears that changed meanwhile is discarded and decided again."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fakeclock import FakeClock

from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller
from gearshift.core import round as core_round

from .workers import POLICY, WAIT, Worker


def _hold(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Make every profile's decision (the policy's part of a round) wait until `gate` is set
    (`entered`: one has started); one still held after WAIT fails (TimeoutError), as it does
    when the loop itself waited on it."""
    gate, entered = threading.Event(), threading.Event()
    real = core_round.decide

    def held(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        if not gate.wait(WAIT):
            raise TimeoutError("the round was held while the loop waited on it")
        return real(*args, **kwargs)

    monkeypatch.setattr(core_round, "decide", held)
    return gate, entered


@pytest.fixture
def background(config: ControllerConfig, clock: FakeClock) -> Iterator[Controller]:
    """A controller in virtual time whose rounds run in their own threads, as `serve`'s do."""
    c = Controller.open(config, POLICY, clock=clock, background_rounds=True)
    yield c
    c.close()


def _until(controller: Controller, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WAIT
    while not done():
        assert time.monotonic() < deadline, "the round was never applied"
        controller.step()
        time.sleep(0.001)


def test_a_slow_round_never_stops_the_loop_beating_and_draining(
    background: Controller, clock: FakeClock, namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = Worker(namespace, 0, clock)
    try:
        w.register(0, "decode", serve=background.step)
        _until(background, lambda: background.rounds["count"] >= 1)  # the registration's
        gate, entered = _hold(monkeypatch)
        rounds = background.rounds["count"]
        clock.advance(POLICY.update_interval_seconds)
        background.step()  # the round starts, and is held
        assert entered.wait(WAIT)
        for _ in range(5):  # the loop goes on while the round is held
            consumed = background.counts["consumed"]
            assert w.put(0, 40)
            clock.advance(0.1)
            background.step()
            assert background.counts["consumed"] == consumed + 1  # drained
            assert background.registry.controller().heartbeat_ns == int(clock.now() * 1e9)
        assert background.rounds["count"] == rounds  # not applied before it is decided
        gate.set()
        _until(background, lambda: background.rounds["count"] > rounds)
        assert background.counts["errors"] == 0
    finally:
        w.close()


def test_a_round_decided_on_changed_gears_is_decided_again(
    background: Controller, clock: FakeClock, namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = Worker(namespace, 0, clock)
    try:
        w.register(0, "decode", serve=background.step)
        _until(background, lambda: background.rounds["count"] >= 1)
        gate, entered = _hold(monkeypatch)
        rounds = background.rounds["count"]
        clock.advance(POLICY.update_interval_seconds)
        background.step()
        assert entered.wait(WAIT)
        w.register(1, "prefill", serve=background.step)  # a new profile while it is decided
        gate.set()
        _until(background, lambda: background.decider.stale == 1)
        assert background.rounds["count"] == rounds  # discarded, not applied
        _until(background, lambda: background.rounds["count"] > rounds)  # decided again
        assert background.devices[0].profiles.keys() == {"decode", "prefill"}
        assert background.counts["errors"] == 0
    finally:
        w.close()
