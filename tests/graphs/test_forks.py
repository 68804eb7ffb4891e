"""A child forked after Inductor compiled in the parent gets a compile thread pool of its own
(`graphs.forks`; the runners' and Dynamo's locks: `test_compiled.py`'s fork test)."""

from __future__ import annotations

import torch
from forked import in_child

import gearshift.graphs.forks  # noqa: F401  (the hook)


def test_the_childs_inductor_thread_pool_runs_its_tasks() -> None:
    """torch's own fork hook renews Inductor's process pool only: the C++ compiles a child
    submits to the parent's thread pool, whose threads it lacks, waited for ever (a cold
    Inductor compile in a pre-fork server's child never ended)."""
    from torch._inductor.async_compile import AsyncCompile

    with torch._inductor.config.patch(compile_threads=2):
        AsyncCompile.pool.cache_clear()
        assert AsyncCompile.pool().submit(int, 1).result(10) == 1  # a thread, idle after
        status, found = in_child(lambda: str(AsyncCompile.pool().submit(int, 2).result(10)), 30)
        AsyncCompile.pool.cache_clear()
    assert found == "2", status
