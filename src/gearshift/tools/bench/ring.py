"""`gearshift bench ring`: event rings against pickled events through a multiprocessing.Queue.

Each figure comes with the naive design measured in the same run:
- put: one `EventRing.put` (batches of 1000 into a drained ring) vs `Queue.put` of the same
  event tuple (medians of batch means).
- drain: `drain()` of a full ring vs `Queue.get` of queued events, events per second.
- end to end: N producer processes put flat out, each into its own ring, for S seconds while
  one consumer drains them all; vs N producer processes putting into one bounded Queue and one
  consumer getting. Events consumed per second; events the rings dropped.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import statistics
import time
from collections.abc import Callable
from multiprocessing.context import BaseContext
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event

import click

from gearshift.clikit import json_option
from gearshift.shm import EventRing
from gearshift.tools.bench.cli import echo_result

EVENT = (123_456_789, 3, 7, (1000, 37), (1, 1))  # t_ns, profile, version, values, chunks
CHECK_EVERY = 1024  # puts between looks at the stop flag


def per_call_ns(
    fn: Callable[..., object],
    *args: object,
    calls: int = 1000,
    repeats: int = 15,
    between: Callable[[], object] | None = None,
) -> float:
    """Median over `repeats` batches of the mean ns of one of `calls` calls `fn(*args)`;
    `between` runs after each batch, untimed."""
    means = []
    for _ in range(repeats):
        began = time.perf_counter_ns()
        for _ in range(calls):
            fn(*args)
        means.append((time.perf_counter_ns() - began) / calls)
        if between is not None:
            between()
    return statistics.median(means)


def _put_ns(namespace: str, capacity: int) -> float:
    ring = EventRing.create(namespace, 0, capacity)
    try:
        return per_call_ns(ring.put, *EVENT, between=ring.drain)
    finally:
        ring.unlink()
        ring.close()


def _drain_rate(namespace: str, capacity: int) -> float:
    ring = EventRing.create(namespace, 0, capacity)
    try:
        seconds = []
        for _ in range(10):
            while ring.put(*EVENT):
                pass
            began = time.perf_counter()
            ring.drain()
            seconds.append(time.perf_counter() - began)
        return capacity / statistics.median(seconds)
    finally:
        ring.unlink()
        ring.close()


def _queue_put_ns() -> float:
    q: multiprocessing.Queue = multiprocessing.Queue()
    try:
        return per_call_ns(q.put, EVENT, between=lambda: [q.get() for _ in range(1000)])
    finally:
        q.close()


def _queue_get_rate(events: int = 20_000) -> float:
    q: multiprocessing.Queue = multiprocessing.Queue()
    for _ in range(events):
        q.put(EVENT)
    q.get()  # the feeder thread is flushing into the pipe
    began = time.perf_counter()
    for _ in range(events - 1):
        q.get()
    rate = (events - 1) / (time.perf_counter() - began)
    q.close()
    return rate


def _ring_producer(namespace: str, slot: int, ready: Queue, go: Event, stop: Event) -> None:
    ring = EventRing.attach(namespace, slot)
    put = ring.put
    ready.put(slot)
    go.wait(60)
    while not stop.is_set():
        for _ in range(CHECK_EVERY):
            put(*EVENT)
    ring.close()


def _queue_producer(q: Queue, ready: Queue, go: Event, stop: Event) -> None:
    q.cancel_join_thread()  # exit even with events still buffered
    ready.put(0)
    go.wait(60)
    while not stop.is_set():
        for _ in range(CHECK_EVERY):
            try:
                q.put(EVENT, timeout=0.05)
            except queue.Full:
                break


def _run(
    ctx: BaseContext,
    target: Callable[..., None],
    args: list[tuple],
    consume: Callable[[], int],
    seconds: float,
) -> float:
    """Start one producer per args tuple, consume for `seconds`; return events per second."""
    ready, go, stop = ctx.Queue(), ctx.Event(), ctx.Event()
    producers = [ctx.Process(target=target, args=(*a, ready, go, stop), daemon=True) for a in args]
    for p in producers:
        p.start()
    try:
        for _ in producers:
            ready.get(timeout=60)
        go.set()
        consumed, began = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - began) < seconds:
            got = consume()
            consumed += got
            if not got:
                time.sleep(0.0005)
        return consumed / elapsed
    finally:
        stop.set()
        for p in producers:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()


def _get_some(q: Queue, most: int = CHECK_EVERY) -> int:
    """Get up to `most` queued events without blocking; how many were got."""
    for got in range(most):
        try:
            q.get_nowait()
        except queue.Empty:
            return got
    return most


@click.command()
@click.option("--workers", default=2, show_default=True, help="Producer processes.")
@click.option("--seconds", default=3.0, show_default=True, help="End-to-end run length, each.")
@click.option("--capacity", default=1 << 16, show_default=True, help="Records per ring.")
@json_option()
def command(workers: int, seconds: float, capacity: int, as_json: bool) -> None:
    """Time ring put, drain and N producers -> 1 consumer against a multiprocessing.Queue."""
    namespace = f"bench{os.getpid()}"
    ctx = multiprocessing.get_context("spawn")
    put_ns, queue_put_ns = _put_ns(namespace, capacity), _queue_put_ns()
    drain_rate, queue_get_rate = _drain_rate(namespace, capacity), _queue_get_rate()
    rings = [EventRing.create(namespace, slot, capacity) for slot in range(workers)]
    try:
        args = [(namespace, slot) for slot in range(workers)]
        rate = _run(ctx, _ring_producer, args, lambda: sum(len(r.drain()) for r in rings), seconds)
        dropped = sum(r.dropped for r in rings)
    finally:
        for ring in rings:
            ring.unlink()
            ring.close()
    q = ctx.Queue(maxsize=capacity)
    queue_rate = _run(ctx, _queue_producer, [(q,)] * workers, lambda: _get_some(q), seconds)
    result = {
        "workers": workers,
        "seconds": seconds,
        "capacity": capacity,
        "events_per_second": rate,
        "dropped": dropped,
        "baseline_queue_events_per_second": queue_rate,
        "speedup": rate / queue_rate,
        "put_ns_median": put_ns,
        "baseline_queue_put_ns_median": queue_put_ns,
        "put_speedup": queue_put_ns / put_ns,
        "drain_events_per_second": drain_rate,
        "baseline_queue_get_events_per_second": queue_get_rate,
        "drain_speedup": drain_rate / queue_get_rate,
    }
    echo_result(result, as_json)
