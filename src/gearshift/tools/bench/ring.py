"""`gearshift bench ring`: event rings against events through a multiprocessing.Queue.

Each figure comes with its stand-in measured in the same run:
- put: one `EventRing.put` (batches of 1000 into a drained ring) vs `Queue.put` of the same
  event tuple (medians of batch means): per event, both.
- drain: `drain()` of a full ring (one numpy array of records) vs `Queue.get` of the same
  records queued as numpy arrays of BATCH records (batched: what a consumer that wants arrays
  would use), and vs `Queue.get` of one event tuple at a time (per item); events per second.
- end to end: N producer processes put flat out, each into its own ring, for S seconds while
  one consumer drains them all; vs N producer processes putting each event into one bounded
  Queue (per event, as a request path would) and one consumer getting. Events consumed per
  second; events the rings dropped. Repeated `--runs` times, the two designs in turn
  (alternating which goes first), and reported as median and range (`spread`).
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
import numpy as np

from gearshift.clikit import json_option
from gearshift.shm import EVENT_DTYPE, EventRing
from gearshift.tools.bench.cli import echo_result
from gearshift.tools.bench.spread import paired, summarise

EVENT = (123_456_789, 3, 7, (1000, 37), (1, 1))  # t_ns, profile, version, values, chunks
CHECK_EVERY = 1024  # puts between looks at the stop flag
BATCH = 1024  # records per array of the batched Queue stand-in


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


def _queue_get_batched_rate(capacity: int) -> float:
    """Events per second got from a Queue holding the records of a full ring as arrays of
    BATCH records (what `drain` returns, in pieces)."""
    ring = EventRing.create(f"bench-batched-{os.getpid()}", 0, capacity)
    try:
        while ring.put(*EVENT):
            pass
        records = ring.drain()
    finally:
        ring.unlink()
        ring.close()
    q: multiprocessing.Queue = multiprocessing.Queue()
    batches = [records[i:i + BATCH].copy() for i in range(0, len(records), BATCH)]
    for batch in batches:
        q.put(batch)
    first = q.get()  # the feeder thread is flushing into the pipe
    began = time.perf_counter()
    got = [q.get() for _ in batches[1:]]
    rate = (len(records) - len(first)) / (time.perf_counter() - began)
    q.close()
    assert all(np.array_equal(got[-1][f], batches[-1][f]) for f in EVENT_DTYPE.names)
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


def _rings_rate(ctx: BaseContext, namespace: str, workers: int, capacity: int,
                seconds: float) -> tuple[float, int]:
    """N producers -> 1 consumer through rings: events per second, events dropped."""
    rings = [EventRing.create(namespace, slot, capacity) for slot in range(workers)]
    try:
        args = [(namespace, slot) for slot in range(workers)]
        rate = _run(ctx, _ring_producer, args, lambda: sum(len(r.drain()) for r in rings), seconds)
        return rate, sum(r.dropped for r in rings)
    finally:
        for ring in rings:
            ring.unlink()
            ring.close()


def _queue_rate(ctx: BaseContext, workers: int, capacity: int, seconds: float) -> float:
    q = ctx.Queue(maxsize=capacity)
    try:
        return _run(ctx, _queue_producer, [(q,)] * workers, lambda: _get_some(q), seconds)
    finally:
        q.close()


@click.command()
@click.option("--workers", default=2, show_default=True, help="Producer processes.")
@click.option("--seconds", default=2.0, show_default=True, help="End-to-end run length, each.")
@click.option("--capacity", default=1 << 16, show_default=True, help="Records per ring.")
@click.option("--runs", default=3, show_default=True, type=click.IntRange(1),
              help="Runs of every figure (median and range).")
@json_option()
def command(workers: int, seconds: float, capacity: int, runs: int, as_json: bool) -> None:
    """Time ring put, drain and N producers -> 1 consumer against a multiprocessing.Queue."""
    namespace = f"bench{os.getpid()}"
    ctx = multiprocessing.get_context("spawn")
    figures: dict[str, list[float]] = {}
    dropped = 0
    for run in range(runs):
        rows = {
            "put_ns_median": _put_ns(namespace, capacity),
            "baseline_queue_put_ns_median": _queue_put_ns(),
            "drain_events_per_second": _drain_rate(namespace, capacity),
            "baseline_queue_get_batched_events_per_second": _queue_get_batched_rate(capacity),
            "baseline_queue_get_events_per_second": _queue_get_rate(),
        }
        if run % 2:  # alternate which design goes first
            queue_rate = _queue_rate(ctx, workers, capacity, seconds)
            rate, lost = _rings_rate(ctx, namespace, workers, capacity, seconds)
        else:
            rate, lost = _rings_rate(ctx, namespace, workers, capacity, seconds)
            queue_rate = _queue_rate(ctx, workers, capacity, seconds)
        rows |= {"events_per_second": rate, "baseline_queue_events_per_second": queue_rate}
        dropped += lost
        for key, value in rows.items():
            figures.setdefault(key, []).append(value)
    result: dict[str, object] = {"workers": workers, "seconds": seconds, "capacity": capacity,
                                 "runs": runs, "dropped": dropped}
    for key, values in figures.items():
        summarise(result, key, values)
    for key, mine, theirs in (
        ("speedup", "events_per_second", "baseline_queue_events_per_second"),
        ("drain_speedup", "drain_events_per_second",
         "baseline_queue_get_batched_events_per_second"),
        ("drain_speedup_per_item", "drain_events_per_second",
         "baseline_queue_get_events_per_second"),
    ):
        paired(result, key, figures[mine], figures[theirs])
    paired(result, "put_speedup", figures["baseline_queue_put_ns_median"],
           figures["put_ns_median"])
    echo_result(result, as_json)
