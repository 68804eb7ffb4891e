"""The adaptive run's clock: wall time until the run starts, then the trace time taken."""

from __future__ import annotations

import multiprocessing
import threading
import time
from types import SimpleNamespace

import numpy as np

from gearshift.tools.demo.clock import TraceClock


def test_follows_the_monotonic_clock_until_the_run_starts() -> None:
    clock = TraceClock(np.array([0.0, 1.0]), SimpleNamespace(value=0.0), SimpleNamespace(value=5))
    before = time.monotonic()
    now = clock.now()
    assert before <= now <= time.monotonic()


def test_then_reads_the_time_of_the_last_row_taken() -> None:
    origin, queue = SimpleNamespace(value=100.0), SimpleNamespace(value=0)
    clock = TraceClock(np.array([0.0, 0.5, 0.5, 2.0]), origin, queue)
    seen = []
    for taken in range(6):  # none yet, each row, then past the end
        queue.value = taken
        seen.append(clock.now())
    assert seen == [100.0, 100.0, 100.5, 100.5, 102.0, 102.0]
    assert clock.now_ns() == 102_000_000_000
    stamps = []
    for taken in range(6):  # the request path's stamps: the same times, in ns
        queue.value = taken
        stamps.append(clock.now_ns())
    assert stamps == [round(t * 1e9) for t in seen]


def test_stamps_wall_time_in_ns_until_the_run_starts_then_trace_time() -> None:
    origin, queue = SimpleNamespace(value=0.0), SimpleNamespace(value=1)
    clock = TraceClock(np.array([0.25, 1.0]), origin, queue)
    before = time.monotonic_ns()
    assert before <= clock.now_ns() <= time.monotonic_ns()
    origin.value = 50.0  # the run starts
    assert clock.now_ns() == 50_250_000_000


def test_reads_shared_values_without_their_locks() -> None:
    ctx = multiprocessing.get_context("spawn")
    origin, queue = ctx.Value("d", 100.0, lock=ctx.Lock()), ctx.Value("q", 2, lock=ctx.Lock())
    clock = TraceClock(np.array([0.0, 0.5, 2.0]), origin, queue)
    seen: list[float] = []
    with queue.get_lock(), origin.get_lock():  # a worker taking a row holds the queue's lock
        reader = threading.Thread(target=lambda: seen.append(clock.now()), daemon=True)
        reader.start()
        reader.join(5.0)
    assert seen == [100.5]
