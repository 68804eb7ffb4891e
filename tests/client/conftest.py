"""Fixtures of the routing client's tests: an in-process fake controller, a client driven by
hand in virtual time, and child processes (forkserver, bounded joins)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator

import pytest
from fake_controller import FakeController, ServingClock

import gearshift as gs
from gearshift.shm import Registry

JOIN_TIMEOUT = 30.0


@pytest.fixture
def fake(namespace: str) -> Iterator[FakeController]:
    controller = FakeController(namespace)
    yield controller
    controller.close()


@pytest.fixture
def client(fake: FakeController) -> Iterator[gs.Client]:
    """A client whose swap thread is the test (`tick()`), in virtual time in which the fake
    controller answers registrations."""
    made = gs.Client(
        Registry.attach(fake.namespace), 0, clock=ServingClock(fake.serve), background=False
    )
    yield made
    made.close()


@pytest.fixture(scope="session")
def mp() -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["fake_controller"])
    return ctx


@pytest.fixture
def spawn(mp) -> Iterator[Callable[..., multiprocessing.Process]]:
    """Start `target(*args)` in a child; every child is joined (or killed) when the test ends."""
    children: list[multiprocessing.Process] = []

    def start(target: Callable, *args: object) -> multiprocessing.Process:
        child = mp.Process(target=target, args=args, daemon=True)
        child.start()
        children.append(child)
        return child

    yield start
    for child in children:
        child.join(JOIN_TIMEOUT)
        if child.is_alive():
            child.kill()
            child.join()
