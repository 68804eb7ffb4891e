"""Child processes of the shm tests: forkserver with the child bodies preloaded."""

from __future__ import annotations

import multiprocessing
from multiprocessing.context import BaseContext

import pytest


@pytest.fixture(scope="session")
def mp() -> BaseContext:
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["shm.procs"])
    return ctx
