"""Child processes of the shm tests: forkserver (clean state, fast starts), bounded joins."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess

import pytest

from shm.procs import Spawn

JOIN_TIMEOUT = 30.0


@pytest.fixture(scope="session")
def mp() -> BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["shm.procs"])
    return ctx


@pytest.fixture
def spawn(mp: BaseContext) -> Iterator[Spawn]:
    """Start `target(*args)` in a child; every child is joined (or killed) when the test ends."""
    children: list[BaseProcess] = []

    def start(target: Callable[..., None], *args: object) -> BaseProcess:
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
    assert all(child.exitcode is not None for child in children)
