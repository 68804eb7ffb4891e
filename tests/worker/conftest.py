"""Fixtures of the routing client's tests: an in-process fake controller, a client driven by
hand in virtual time."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gearshift.shm import Registry
from gearshift.worker import Client
from worker.fake_controller import FakeController, ServingClock


@pytest.fixture
def fake(namespace: str) -> Iterator[FakeController]:
    controller = FakeController(namespace)
    yield controller
    controller.close()


@pytest.fixture
def client(fake: FakeController) -> Iterator[Client]:
    """A client whose swap thread is the test (`tick()`), in virtual time in which the fake
    controller answers registrations."""
    made = Client(
        Registry.attach(fake.namespace), 0, clock=ServingClock(fake.serve), background=False
    )
    yield made
    made.close()
