"""The many-profiles case of `gearshift bench controller`: the state file, its saves, memory and
loop stalls with P profiles of two wide dims under uniform traffic.

Per case, in a fresh process (so that its memory is its own): a controller with decision rounds
every ROUND_SECONDS runs its loop while WORKERS worker processes register P profiles between
them (dims A and B, each [1, max]) and put events flat out, uniform over [1, max] in both dims,
round-robin over their profiles, for S seconds (every slice then sees most values of every dim:
the statistics' worst case). Reported per case (`<figure>_<P>`):

- state_mb: the state file after the graceful stop, against state_dense_mb, what dense rows
  (every slice x every column, as format 1 held them in memory and on disk) take for the same
  statistics, measured in the same run; save_ms: one more full save of the same
  devices, timed (encode, write, fsync, rename); save_loop_ms_max: the longest a save held the
  loop (its snapshot; the writer thread does the rest), save_write_ms_p50: the writer's median
  save, saves: how many it wrote;
- stall_ms_max / stall_ms_p99: the longest and 99th-percentile loop iteration over the load
  (saves, rounds, drains: whatever the loop waited on), round_ms_max: the longest decision
  round's policy part in it (decided in its own thread, the loop draining meanwhile), dropped:
  the events the workers' full rings refused over the load, stop_ms: the graceful stop
  (`close`: final drain and save, once the workers are gone);
- rss_mb / rss_mb_peak: the process's resident memory at the end of the load, and its peak;
  stats_mb: the statistics' arrays (`DimStats.nbytes`), against state_dense_mb;
- distinct: the values the statistics hold per dim (mean over the dims), events: consumed.

Targets (what a node with many profiles needs): at 256 profiles, no loop iteration over
TARGET_STALL_MS because of a save; the state file and the controller's memory proportional to
the (slice, value) entries the statistics hold, not to the dims' ranges.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import tempfile
import time
from multiprocessing.synchronize import Event
from typing import Any

import numpy as np

from gearshift import protocol
from gearshift.clock import MonotonicClock
from gearshift.controller import statefile
from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim
from gearshift.core.stats import DimStats
from gearshift.shm import EventRing, Registry, mailbox

WORKERS = 2
ROUND_SECONDS = 5.0  # decision rounds (and the saves that follow a change) this often
TARGET_STALL_MS = 100.0
CHECK_EVERY = 1024  # puts between looks at the stop flag
WAIT = 60.0  # seconds: bound of every wait


def dims(high: int) -> dict[str, Dim]:
    return {"A": Dim(max=high), "B": Dim(max=high)}


def _produce(namespace: str, device: int, first: int, count: int, high: int, seed: int,
             stop: Event) -> None:
    """A worker: register profiles p<first>..p<first+count-1>, then put uniform events
    round-robin over them until `stop`."""
    registry = Registry.attach(namespace)
    slot = registry.claim_slot(device)
    ring = EventRing.create(namespace, slot)
    for local in range(count):
        assert registry.requests(slot).post(
            protocol.register_message(local, f"p{first + local}", dims(high)))
        deadline = time.monotonic() + WAIT
        while (reply := registry.replies(slot).take()) is None and time.monotonic() < deadline:
            time.sleep(0.001)
        mailbox.raise_for_error(reply or {"error": "timeout", "message": "no reply"})
    rng = np.random.default_rng(seed)
    profile_ids = (np.arange(CHECK_EVERY) % count).tolist()
    now_ns, put = MonotonicClock.now_ns, ring.put
    while not stop.is_set():
        values = rng.integers(1, high + 1, (CHECK_EVERY, 2)).tolist()  # fresh values each time
        for profile, pair in zip(profile_ids, values, strict=True):
            put(now_ns(), profile, 0, pair, (1, 1))
    ring.close()
    registry.release_slot(slot)
    registry.close()


def _memory_mb() -> tuple[float, float]:
    """(VmRSS, VmHWM) of this process in MB."""
    with open("/proc/self/status") as f:
        kb = {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in f)
              if k in ("VmRSS", "VmHWM")}
    return kb["VmRSS"] / 1024, kb["VmHWM"] / 1024


def _case(profiles: int, high: int, seconds: float) -> dict[str, Any]:
    """One case, in this process: see the module docstring."""
    namespace = f"bench-profiles-{os.getpid()}"
    policy = PolicyConfig(check_interval_seconds=ROUND_SECONDS,
                          update_interval_seconds=ROUND_SECONDS)
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    share = [profiles // WORKERS + (i < profiles % WORKERS) for i in range(WORKERS)]
    with tempfile.TemporaryDirectory() as state_dir:
        controller = Controller.open(ControllerConfig(namespace=namespace, state_dir=state_dir),
                                     policy)
        clock, interval = controller.clock, controller.config.drain_interval_seconds
        procs = [ctx.Process(target=_produce, args=(namespace, i % 2, sum(share[:i]), n, high,
                                                    i, stop), daemon=True)
                 for i, n in enumerate(share) if n]
        stalls: list[float] = []
        try:
            for p in procs:
                p.start()
            deadline = clock.now() + WAIT * 5
            while sum(len(w.profiles) for w in controller.workers.values()) < profiles:
                assert clock.now() < deadline, "the workers did not register"
                controller.step()
                clock.sleep(interval)
            before, rounds = controller.counts["consumed"], controller.rounds["count"]
            dropped = _dropped(controller)
            end = clock.now() + seconds
            while (began := clock.now()) < end:
                controller.step()
                stalls.append(clock.now() - began)
                clock.sleep(interval - stalls[-1])
            events = controller.counts["consumed"] - before
            dropped = _dropped(controller) - dropped
            decided = list(controller.decisions.recent)[rounds:]
            saver = controller.saver
            writes = {"save_loop_ms_max": max(saver.loop_seconds, default=0.0) * 1e3,
                      "save_write_ms_p50": statistics.median(saver.seconds) * 1e3
                      if saver.seconds else 0.0, "saves": saver.saves}
            rss, _ = _memory_mb()
            every = [s for dev in controller.devices.values() for p in dev.profiles.values()
                     for s in (*p.stats.values(), *p.history.values())]
            seen = [len(s.view(clock.now()).values) for s in every if s.history is not None]
            dense = sum(_dense_bytes(s) for s in every) / 1e6
            held = sum(s.nbytes for s in every) / 1e6
        finally:
            stop.set()
            for p in procs:  # gone before the stop, so that it removes the namespace
                if p.pid is None:  # not started
                    continue
                p.join(WAIT)
                if p.is_alive():
                    p.kill()
            began = time.perf_counter()
            controller.close()
            stop_ms = (time.perf_counter() - began) * 1e3
        _, peak = _memory_mb()
        path = controller.config.state_path / statefile.STATE_FILE
        state_mb = path.stat().st_size / 1e6
        began = time.perf_counter()
        statefile.save(controller.config.state_path, controller.devices, controller.costs)
        save_ms = (time.perf_counter() - began) * 1e3
    ms = sorted(s * 1e3 for s in stalls)
    return {f"{k}_{profiles}": v for k, v in {
        "state_mb": state_mb, "state_dense_mb": dense, "stats_mb": held, "save_ms": save_ms,
        "stall_ms_max": ms[-1],
        "stall_ms_p99": ms[min(len(ms) - 1, int(0.99 * len(ms)))],
        "stalls_over_target": sum(m > TARGET_STALL_MS for m in ms), "stop_ms": stop_ms,
        "rss_mb": rss, "rss_mb_peak": peak, "distinct": statistics.fmean(seen) if seen else 0.0,
        "round_ms_max": max(decided, default=0.0) * 1e3, "events": events,
        "dropped": dropped, **writes}.items()}


def _dropped(controller: Controller) -> int:
    """The events the workers' rings refused so far (full), over the live workers."""
    return sum(w.ring.dropped for w in controller.workers.values() if w.ring is not None)


def _dense_bytes(stats: DimStats) -> int:
    """What format 1 (rows x columns, dense) holds of the same statistics: 16 B a cell and
    16 B a column."""
    frozen = stats.frozen()
    return 16 * len(frozen.values) * (len(frozen.keys) + 1)


def _child(profiles: int, high: int, seconds: float, out: Any) -> None:
    out.send(_case(profiles, high, seconds))


def many_profiles(cases: list[int], high: int, seconds: float) -> dict[str, Any]:
    """Every case in a fresh spawned process, one after another (see the module docstring)."""
    ctx = multiprocessing.get_context("spawn")
    result: dict[str, Any] = {"profile_dims_max": high, "profile_seconds": seconds}
    for profiles in cases:
        mine, theirs = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(profiles, high, seconds, theirs))
        proc.start()
        theirs.close()
        try:
            if not mine.poll(seconds + WAIT * 10):
                raise RuntimeError(f"the {profiles}-profile case gave no result")
            result.update(mine.recv())
        except EOFError:
            raise RuntimeError(f"the {profiles}-profile case failed "
                               f"(exit {proc.exitcode})") from None
        finally:
            proc.join(WAIT)
            if proc.is_alive():
                proc.kill()
    return result
