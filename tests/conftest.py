"""Shared fixtures: unique shared-memory namespaces, and a session-wide leak check."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

PREFIX = f"gstest{os.getpid()}x"
_counter = itertools.count()


def _leaked() -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if PREFIX in n)


@pytest.fixture
def namespace() -> str:
    """A namespace no other test uses."""
    return f"{PREFIX}{next(_counter)}"


@pytest.fixture(scope="session", autouse=True)
def no_leaked_segments() -> Iterator[None]:
    yield
    leaked = _leaked()
    for name in leaked:
        os.unlink(os.path.join("/dev/shm", name))
    assert not leaked, f"the test run left shared-memory segments behind: {leaked}"
