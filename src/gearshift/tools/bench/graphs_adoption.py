"""The 2-worker adoption path of `gearshift bench graphs`: two worker processes on one device
under a controller run in this process, with traffic that moves the gears.

Each worker (spawned: a process that has used CUDA cannot fork) connects, registers the profile,
builds its runner on the device (`Profile.runner`: graphs in the device's pool, warmed up by the
client's swap thread) and sends requests in a loop, from batch sizes that change every
`phase` seconds (the same in both: CLOCK_MONOTONIC is shared), so that the controller's plan
adds and evicts gears and each worker adopts, captures and releases beside its requests. This
process samples the device's snapshot version and both slots' applied versions every
SAMPLE_SECONDS: a version's lag is the time from its first sight to both workers' acks. It stops
once both acked `versions` new versions, or at `timeout`; each worker reports its requests,
errors (exceptions, outputs unlike eager's), graphs and memory readings.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import statistics
import tempfile
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

import torch

from gearshift.core.config import PolicyConfig
from gearshift.tools.bench.graphs_model import TOLERANCE, Model, dims

POLICY = PolicyConfig(  # seconds, not minutes: a round every half second on a short window
    policy_mode="plan", window_seconds=4.0, half_life_seconds=2.0, slice_seconds=0.25,
    update_interval_seconds=0.5, check_interval_seconds=0.1, recent_use_protect_seconds=1.0,
    device_memory_usage_threshold_ratio=None, plan_history_seconds=8.0, plan_history_weight=0.0,
)
PHASES = ((3, 5, 6, 7), (20, 24, 40, 48))  # the batch sizes of each phase, in turn
SEQUENCES = (1, 1, 1, 9)  # decode mostly, some short prefills
SAMPLE_SECONDS = 0.01
CHECK_EVERY = 50


def adoption(device: str, sizes: tuple[int, int, int], quick: bool) -> dict[str, Any]:
    """Run the two workers under a controller; the figures (see the module)."""
    from gearshift.controller import embedded
    from gearshift.controller.config import ControllerConfig
    from gearshift.shm import Registry, SnapshotRegion, cleanup

    versions, timeout, phase = (2, 60.0, 1.5) if quick else (4, 120.0, 3.0)
    namespace, index = f"bench-graphs-{os.getpid()}", _index(device)
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-graphs") as state_dir:
        config = ControllerConfig(
            namespace=namespace, state_dir=state_dir, scan_interval_seconds=0.05
        )
        controller = embedded.start(config, POLICY)
        workers: list[tuple[Any, Connection]] = []
        try:
            for i in range(2):
                mine, theirs = ctx.Pipe()
                proc = ctx.Process(
                    target=worker, args=(namespace, device, sizes, phase, i, theirs), daemon=True
                )
                proc.start()
                workers.append((proc, mine))
            slots = [_expect(conn, "ready", timeout) for _, conn in workers]
            began = time.monotonic()
            for _, conn in workers:
                conn.send(("go", began))
            registry, region = Registry.attach(namespace), SnapshotRegion.attach(namespace, index)
            try:
                lags = _watch(registry, region, slots, versions, began + timeout)
            finally:
                region.close()
                registry.close()
            for _, conn in workers:
                conn.send(("stop",))
            reports = [_expect(conn, "done", timeout) for _, conn in workers]
        finally:
            for proc, conn in workers:
                proc.join(30)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
                conn.close()
            controller.stop()
            cleanup(namespace)
    return {
        "workers": 2, "seconds": time.monotonic() - began, "versions_acked": len(lags),
        "versions_wanted": versions,
        "lag_seconds_median": statistics.median(lags) if lags else None,
        "lag_seconds_max": max(lags) if lags else None,
        "errors": sum(r["errors"] + r["wrong"] for r in reports) + (len(lags) < versions),
        "per_worker": reports,
    }


def worker(namespace: str, device: str, sizes: tuple[int, int, int], phase: float, seed: int,
           conn: Connection) -> None:
    """One worker process (see the module); replies ("ready", slot), then ("done", report)
    or ("error", traceback)."""
    try:
        if device.startswith("cpu"):
            torch.set_num_threads(1)
        import gearshift as gs

        width = sizes[0]
        model = Model(*sizes, device)
        with gs.connect(namespace, _index(device)) as client:
            prof = client.profile("decode", dims())
            example = {"x": torch.zeros(1, 1, width, device=device)}
            runner = prof.runner(model, {"x": ("B", "S", None)}, example, outputs=("B", "S", None))
            conn.send(("ready", client.slot))
            began = conn.recv()[1]
            rng = random.Random(seed)
            first = runner.backend.mem_get_info()
            n = errors = wrong = 0
            versions = {prof.version}
            while not conn.poll():
                batches = PHASES[int((time.monotonic() - began) / phase) % len(PHASES)]
                n += 1
                try:
                    with gs.outside_capture():  # the default generator, beside captures
                        x = torch.randn(rng.choice(batches), rng.choice(SEQUENCES), width,
                                        device=device)
                    y = prof.run(x=x)
                    if n % CHECK_EVERY == 0 and not torch.allclose(y, model(x), **TOLERANCE):
                        wrong += 1
                except Exception:
                    errors += 1
                versions.add(prof.version)
            conn.recv()
            report = {
                "requests": n, "errors": errors, "wrong": wrong, "versions": len(versions),
                "gears": {d: list(g) for d, g in prof.gears.items()},
                "graphs": len(runner.pool), **dict(runner.stats),
                "free_bytes_first": first[0], "free_bytes_last": runner.backend.mem_get_info()[0],
            }
        conn.send(("done", report))
    except BaseException:
        with contextlib.suppress(OSError):
            conn.send(("error", traceback.format_exc()))
        raise


def _watch(registry: Any, region: Any, slots: list[int], versions: int,
           deadline: float) -> list[float]:
    """Lags of the versions published from now on until `versions` are acked by both slots."""
    seen: dict[int, float] = {}
    lags: list[float] = []
    start = region.version()
    while len(lags) < versions and time.monotonic() < deadline:
        now, version = time.monotonic(), region.version()
        if version > start:
            seen.setdefault(version, now)
        infos = {info.slot: info for info in registry.slots()}
        acked = min(infos[s].applied_version for s in slots)
        for v in sorted(seen):
            if v <= acked:
                lags.append(now - seen.pop(v))
        time.sleep(SAMPLE_SECONDS)
    return lags


def _expect(conn: Connection, kind: str, timeout: float) -> Any:
    if not conn.poll(timeout):
        raise TimeoutError(f"no {kind!r} from a worker in {timeout:.0f} s")
    message = conn.recv()
    if message[0] != kind:
        raise RuntimeError(f"a worker answered {message[0]!r}: {message[1]}")
    return message[1]


def _index(device: str) -> int:
    return int(device.partition(":")[2] or 0)
