"""Fixtures of the controller's tests: a controller in virtual time (`step()` by hand), with
its state in a temporary directory, and in-process workers made of the shm primitives."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fakeclock import FakeClock

from gearshift.clock import MonotonicClock
from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller

from .workers import POLICY, Worker


@pytest.fixture(autouse=True)
def _root_level() -> Iterator[None]:
    """`serve` sets the root logger's level: give it back."""
    level = logging.getLogger().level
    yield
    logging.getLogger().setLevel(level)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(MonotonicClock().now())  # near real time: child processes' events line up


@pytest.fixture
def config(namespace: str, tmp_path: Path) -> ControllerConfig:
    return ControllerConfig(namespace=namespace, state_dir=str(tmp_path / "state"))


@pytest.fixture
def controller(config: ControllerConfig, clock: FakeClock) -> Iterator[Controller]:
    c = Controller.open(config, POLICY, clock=clock)
    yield c
    c.close()


@pytest.fixture
def worker(controller: Controller, clock: FakeClock) -> Iterator[Callable[..., Worker]]:
    """Make in-process workers; they detach before the controller closes."""
    made: list[Worker] = []

    def make(device: int = 0) -> Worker:
        made.append(Worker(controller.config.namespace, device, clock))
        return made[-1]

    yield make
    for w in made:
        w.close()
