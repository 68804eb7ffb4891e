"""`gearshift bench controller`: the controller loop under load, in this process.

N worker processes (spread over 2 devices) register one profile (BATCHSIZE 1..256, SEQLEN
1..8192, log-normal sizes) and put events flat out into their rings for S seconds, while the
controller runs its loop here (default window), twice: at the default cadence (a round every
15 s: none after the first, in S seconds), then with a round every 0.1 s.

- events_per_second: events the loop consumed per CPU second of its thread at the default
  cadence (whole iterations: drain, fold, scans, registrations, status), so the figure is one
  core's capacity even when the producers hold both cores; events_per_second_busy_rounds the
  same with a round every 0.1 s;
- decide_ms_p50: median wall time of a decision round in the second run (views + decide for
  every profile of a device, under the same load; the publish and the state save that may
  follow are not in it); that run goes on past S seconds until it has `--min-rounds` rounds
  (bounded by WAIT), so that the figure has samples however slow the machine;
- rss_mb_start / rss_mb_end: this process's resident memory after a warm-up of the same load
  (in which the statistics get a column per distinct value: bounded by the dims' ranges, not by
  events) and at the end.

Baseline, same run: the same fold written per event in Python (an exp-weight into a dict per
(slice, value), as a per-sample design would), against `ingest.fold`, on one batch of the same
traffic; both must give every value the same decayed weight and count (`check_same_fold`);
timed in each of `--runs` runs, reported as median and range (`spread`), `fold_speedup` run by
run.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from multiprocessing.synchronize import Event

import click
import numpy as np

from gearshift import protocol
from gearshift.clikit import json_option
from gearshift.clock import MonotonicClock
from gearshift.controller import ingest
from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim
from gearshift.core.round import ProfileLedger
from gearshift.shm import EVENT_DTYPE, EventRing, Kind, Registry, mailbox
from gearshift.tools.bench.cli import echo_result
from gearshift.tools.bench.controller_profiles import many_profiles
from gearshift.tools.bench.spread import paired, summarise

DIMS = {"BATCHSIZE": Dim(max=256), "SEQLEN": Dim(max=8192)}
SHAPE = {"BATCHSIZE": (3.0, 1.0), "SEQLEN": (6.0, 1.2)}  # log-normal mean and sigma
CHECK_EVERY = 1024  # puts between looks at the stop flag
WAIT = 30.0  # seconds: bound of every wait


def draw_sizes(n: int, seed: int) -> np.ndarray:
    """`n` rows of one size per dim (log-normal, clipped to the dim), seeded."""
    rng = np.random.default_rng(seed)
    return np.stack(
        [
            np.clip(rng.lognormal(*SHAPE[d], n), 1, dim.max).astype(np.int64)
            for d, dim in DIMS.items()
        ],
        axis=1,
    )


def _produce(namespace: str, device: int, seed: int, stop: Event) -> None:
    """A worker: register, then put events until `stop` (its ring drops what does not fit)."""
    registry = Registry.attach(namespace)
    slot = registry.claim_slot(device)
    ring = EventRing.create(namespace, slot)
    assert registry.requests(slot).post(protocol.register_message(0, "decode", DIMS))
    deadline = time.monotonic() + WAIT
    while (reply := registry.replies(slot).take()) is None and time.monotonic() < deadline:
        time.sleep(0.001)
    mailbox.raise_for_error(reply or {"error": "timeout", "message": "no reply"})
    sizes = [tuple(row) for row in draw_sizes(CHECK_EVERY, seed).tolist()]
    now_ns, put = MonotonicClock.now_ns, ring.put
    while not stop.is_set():
        for values in sizes:
            put(now_ns(), 0, 0, values, (1, 1))
    ring.close()
    registry.release_slot(slot)
    registry.close()


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 1024


def _load(
    workers: int, seconds: float, warmup: float, policy: PolicyConfig, min_rounds: int = 0
) -> dict[str, float | int]:
    namespace = f"bench-controller-{os.getpid()}"
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    with tempfile.TemporaryDirectory() as state_dir:
        controller = Controller.open(
            ControllerConfig(namespace=namespace, state_dir=state_dir), policy
        )
        clock, interval = controller.clock, controller.config.drain_interval_seconds
        procs = [
            ctx.Process(target=_produce, args=(namespace, i % 2, i, stop), daemon=True)
            for i in range(workers)
        ]
        try:
            for p in procs:
                p.start()
            deadline = clock.now() + WAIT
            while sum(len(w.profiles) for w in controller.workers.values()) < workers:
                assert clock.now() < deadline, "the workers did not register"
                controller.step()
                clock.sleep(interval)
            _loop(controller, warmup)
            rss_start, rounds = _rss_mb(), controller.rounds["count"]
            consumed, cpu = _loop(
                controller, seconds, lambda: controller.rounds["count"] - rounds >= min_rounds
            )
            rss_end = _rss_mb()
            dropped = sum(w.ring.dropped for w in controller.workers.values() if w.ring)
            round_ms = [s * 1e3 for s in list(controller.decisions.recent)[rounds:]]
        finally:
            stop.set()
            for p in procs:
                p.join(WAIT)
                if p.is_alive():
                    p.kill()
            controller.close()
    rounds_out = (
        {"decide_ms_p50": statistics.median(round_ms), "decide_ms_max": max(round_ms)}
        if round_ms
        else {}
    )
    return {
        "events_per_second": consumed / cpu,
        "events_consumed": consumed,
        "events_dropped": dropped,
        "loop_cpu_share": cpu / seconds,
        **rounds_out,
        "rounds": len(round_ms),
        "rss_mb_start": rss_start,
        "rss_mb_end": rss_end,
    }


def _loop(
    controller: Controller, seconds: float, done: Callable[[], bool] = lambda: True
) -> tuple[int, float]:
    """Run the loop for `seconds`, and on until `done()` (AssertionError after WAIT more);
    events consumed and CPU seconds of this thread in steps."""
    clock, interval = controller.clock, controller.config.drain_interval_seconds
    consumed, cpu = 0, 0.0
    end = clock.now() + seconds
    while (now := clock.now()) < end or not done():
        assert now < end + WAIT, "the loop did not get there in time"
        began, before, cpu_began = clock.now(), controller.counts["consumed"], time.thread_time()
        controller.step()
        cpu += time.thread_time() - cpu_began
        consumed += controller.counts["consumed"] - before
        clock.sleep(interval - (clock.now() - began))
    return consumed, cpu


def fold_per_event(
    events: np.ndarray, profile: ProfileLedger, config: PolicyConfig
) -> dict[str, dict[tuple[int, int], list[float]]]:
    """The baseline: per event, validate, then add exp(λ(t − slice start)) and 1 to the
    (slice, value) cell of each dim."""
    lam = math.log(2) / config.half_life_seconds
    width = config.slice_seconds
    dims = list(profile.dims.items())
    cells: dict[str, dict[tuple[int, int], list[float]]] = {name: {} for name, _ in dims}
    rows = zip(
        events["t_ns"].tolist(),
        events["kind"].tolist(),
        events["ndim"].tolist(),
        events["values"].tolist(),
        strict=True,
    )
    for t_ns, kind, ndim, values in rows:
        if kind not in (Kind.SHAPE, Kind.EAGER) or ndim != len(dims):
            continue
        if not all(dim.min <= v <= dim.max for (_, dim), v in zip(dims, values, strict=False)):
            continue
        t = t_ns * 1e-9
        k = math.floor(t / width)
        w = math.exp(lam * (t - k * width))
        for (name, _), v in zip(dims, values, strict=False):
            cell = cells[name].setdefault((k, v), [0.0, 0])
            cell[0] += w
            cell[1] += 1
    return cells


def check_same_fold(
    cells: dict[str, dict[tuple[int, int], list[float]]],
    profile: ProfileLedger,
    now: float,
    config: PolicyConfig,
) -> None:
    """The per-event fold's cells and the profile's statistics (each event folded once) give
    every value the same decayed weight at `now` and the same count (AssertionError if not)."""
    lam = math.log(2) / config.half_life_seconds
    for name, dim_cells in cells.items():
        view = profile.stats[name].view(now)
        weights: dict[int, float] = {}
        counts: dict[int, float] = {}
        for (k, v), (w, c) in dim_cells.items():
            weights[v] = weights.get(v, 0.0) + w * math.exp(-lam * (now - k * config.slice_seconds))
            counts[v] = counts.get(v, 0) + c
        assert view.values.tolist() == sorted(weights), name
        assert view.counts.tolist() == [counts[v] for v in sorted(counts)], name
        assert np.allclose(view.weights, [weights[v] for v in sorted(weights)], rtol=1e-9), name


def _baseline(n: int, runs: int) -> dict[str, object]:
    config = PolicyConfig()
    events = np.zeros(n, EVENT_DTYPE)
    events["t_ns"] = np.linspace(0, 1e9, n).astype(np.int64)
    events["values"][:, : len(DIMS)] = draw_sizes(n, 0)
    events["kind"], events["ndim"] = Kind.SHAPE, len(DIMS)
    keys = np.zeros(n, np.int64)
    once = ProfileLedger.new(DIMS, 0.0, config)
    ingest.fold(events, keys, [once], 1.0)
    check_same_fold(fold_per_event(events, once, config), once, 1.0, config)
    profile = ProfileLedger.new(DIMS, 0.0, config)
    ingest.fold(events, keys, [profile], 1.0)  # warm: every value has its column
    vectorised, per_event = [], []
    for _ in range(runs):
        began = time.perf_counter()
        ingest.fold(events, keys, [profile], 1.0)
        vectorised.append(n / (time.perf_counter() - began))
        began = time.perf_counter()
        fold_per_event(events, profile, config)
        per_event.append(n / (time.perf_counter() - began))
    out: dict[str, object] = {}
    summarise(out, "fold_events_per_second", vectorised)
    summarise(out, "baseline_events_per_second", per_event)
    paired(out, "fold_speedup", vectorised, per_event)
    return out


@click.command()
@click.option(
    "--workers",
    default=4,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Worker processes putting events flat out.",
)
@click.option(
    "--seconds",
    default=5.0,
    show_default=True,
    type=click.FloatRange(min=0.5),
    help="Duration of the load.",
)
@click.option(
    "--warmup",
    default=1.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="Seconds of the same load before the measurement.",
)
@click.option(
    "--baseline-events",
    default=200_000,
    show_default=True,
    type=click.IntRange(min=1000),
    help="Batch size of the fold comparison.",
)
@click.option(
    "--min-rounds",
    default=5,
    show_default=True,
    type=click.IntRange(min=1),
    help="Decision rounds the busy run needs (it goes on past --seconds until it has them).",
)
@click.option(
    "--runs",
    default=3,
    show_default=True,
    type=click.IntRange(1),
    help="Runs of the fold comparison (median and range).",
)
@click.option(
    "--profiles",
    default="16,256",
    show_default=True,
    help="Cases of the many-profiles run, comma-separated profile counts ('' skips it).",
)
@click.option(
    "--profile-max",
    default=8192,
    show_default=True,
    type=click.IntRange(2, 1 << 20),
    help="The many-profiles run's dims range: uniform traffic over [1, max].",
)
@click.option(
    "--profile-seconds",
    default=20.0,
    show_default=True,
    type=click.FloatRange(min=0.5),
    help="Duration of each many-profiles case.",
)
@json_option()
def command(
    workers: int,
    seconds: float,
    warmup: float,
    baseline_events: int,
    min_rounds: int,
    runs: int,
    profiles: str,
    profile_max: int,
    profile_seconds: float,
    as_json: bool,
) -> None:
    """Drain and fold throughput of the controller loop (events per CPU second), decision
    round time and memory while N workers put events flat out, plus the vectorised fold
    against a per-event Python fold on the same batch; then the many-profiles cases (state
    file, save time, memory and loop stalls: `controller_profiles`)."""
    try:
        cases = [int(p) for p in profiles.split(",") if p.strip()]
    except ValueError:
        raise click.BadParameter(f"{profiles!r} is not a list of integers",
                                 param_hint="--profiles") from None
    if any(not 1 <= p <= 4096 for p in cases):
        raise click.BadParameter("profile counts are within [1, 4096]", param_hint="--profiles")
    calm = _load(workers, seconds, warmup, PolicyConfig())
    busy = _load(
        workers,
        seconds,
        warmup,
        dataclasses.replace(
            PolicyConfig(), check_interval_seconds=0.1, update_interval_seconds=0.1
        ),
        min_rounds,
    )
    result = {
        "workers": workers,
        "seconds": seconds,
        **{k: v for k, v in busy.items() if k != "events_per_second"},
        "events_per_second": calm["events_per_second"],
        "events_per_second_busy_rounds": busy["events_per_second"],
        **_baseline(baseline_events, runs),
        **(many_profiles(cases, profile_max, profile_seconds) if cases else {}),
    }
    echo_result(result, as_json)
