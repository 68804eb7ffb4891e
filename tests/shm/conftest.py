"""Child processes of the shm tests: forkserver (clean state, fast starts), bounded joins."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator

import pytest

JOIN_TIMEOUT = 30.0


@pytest.fixture(scope="session")
def mp() -> multiprocessing.context.BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["shm_procs"])
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
    assert all(child.exitcode is not None for child in children)
