"""Bodies of the gloo harness's rank processes (importable by multiprocessing's forkserver,
which preloads torch and gearshift: tests/conftest.py `mp`).

Every rank joins a gloo process group of `size` ranks on 127.0.0.1:`port`, with collectives
bounded by COLLECTIVE_SECONDS, and a second gloo group of its own for the harness's check: each
step's chosen gear is all-gathered there, outside gearshift and outside the model's
communicator. Each rank reports to `results` (a queue): ("step", rank, step, gears of every
rank) when gears differ, ("done", rank, steps, worst relative error, steps whose gears
differed) at the end, or ("error", rank, step, what) before it exits 1.
"""

from __future__ import annotations

import datetime
import random
import sys
import time
from bisect import bisect_left
from collections.abc import Callable

import torch
import torch.distributed as dist

import gearshift as gs
from gearshift import protocol
from gearshift.graphs.adaptive import AdaptiveRunner
from gearshift.graphs.transform import Transform
from gearshift.worker.group import GroupRank, Maintenance
from gearshift.worker.session import Client
from tp import block

COLLECTIVE_SECONDS = 15.0  # a collective that waits longer raises instead of hanging
HAZARD_SECONDS = 3.0  # the negative control's: its hang is the expected outcome, seen sooner
REJOIN_SECONDS = 20.0
MAX_TOKENS = 64
LADDER = (1, 2, 4, 8, 16, 32, 64)  # static gears of the positive control


def traffic(seed: int, steps: int) -> list[int]:
    """Per step the number of tokens, the same on every rank (random, shifting halfway)."""
    rng = random.Random(seed)
    half = steps // 2
    return [rng.randint(1, 24) if i < half else rng.randint(20, MAX_TOKENS) for i in range(steps)]


def inputs(seed: int, step: int, n: int) -> torch.Tensor:
    """Step `step`'s input rows: the same on every rank (tensor parallel: one batch)."""
    g = torch.Generator().manual_seed(seed * 100_003 + step)
    return torch.randn(n, block.HIDDEN, generator=g, dtype=block.DTYPE)


def _join(rank: int, size: int, port: int,
          seconds: float = COLLECTIVE_SECONDS) -> dist.ProcessGroup:
    torch.set_num_threads(1)  # one core a rank: the ranks share the machine's few
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=seconds))
    return dist.new_group(backend="gloo")  # the check's own communicator


def _gathered(check: dist.ProcessGroup, size: int, gear: int) -> list[int]:
    out = [torch.zeros(1, dtype=torch.int64) for _ in range(size)]
    dist.all_gather(out, torch.tensor([gear], dtype=torch.int64), group=check)
    return [int(t) for t in out]


def _relative(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def static(rank: int, size: int, port: int, seed: int, steps: int, results) -> None:
    """The positive control: every rank pads each step to the static ladder's gear (a pure
    function of the step's size, the same on every rank) and runs its shard, all-reducing
    inside; the outputs must equal the unsharded block on the unpadded input."""
    step = -1
    try:
        check = _join(rank, size, port)
        full = block.weights(seed)
        mine = block.shard(full, rank, size)
        worst, differed = 0.0, 0
        for step, n in enumerate(traffic(seed, steps)):
            gear = LADDER[bisect_left(LADDER, n)]
            x = inputs(seed, step, n)
            padded = torch.cat([x, torch.zeros(gear - n, block.HIDDEN, dtype=block.DTYPE)])
            y = block.forward(padded, mine, dist.group.WORLD)[:n]
            worst = max(worst, _relative(y, block.reference(x, full)))
            gears = _gathered(check, size, gear)
            if len(set(gears)) > 1:
                differed += 1
                results.put(("step", rank, step, gears))
        results.put(("done", rank, steps, worst, differed))
        dist.destroy_process_group()
    except BaseException as e:  # reported, then a nonzero exit
        results.put(("error", rank, step, f"{type(e).__name__}: {str(e)[:300]}"))
        sys.exit(1)


def ungrouped(rank: int, size: int, port: int, seed: int, steps: int, namespace: str,
              pause: float, results) -> None:
    """The negative control: every rank is an ordinary gearshift worker of its own device
    (rank r on device r), its profile ungrouped (today's per-device decisions, adoption on the
    rank's own time, warm-ups and captures on its swap thread), its runner's function the
    sharded block with the all-reduces inside. Each step's routed gear is all-gathered on the
    check's communicator; the first step whose gears differ ends the run."""
    step = -1
    try:
        check = _join(rank, size, port, HAZARD_SECONDS)
        full = block.weights(seed)
        mine = block.shard(full, rank, size)

        def fn(x: torch.Tensor) -> torch.Tensor:
            return block.forward(x, mine, dist.group.WORLD)

        worst, differed = 0.0, 0
        with gs.connect(namespace, device=rank) as client:
            prof = client.profile("tp", {"SEQLEN": gs.Dim(max=MAX_TOKENS)})
            example = {"x": torch.zeros(MAX_TOKENS, block.HIDDEN, dtype=block.DTYPE)}
            runner = prof.runner(fn, {"x": ("S", None)}, example, outputs=("S", None))
            for step, n in enumerate(traffic(seed, steps)):
                x = inputs(seed, step, n)
                with prof.request(SEQLEN=n) as route:
                    y = runner.run({"x": x})
                gear = route.gears["SEQLEN"] or 0
                worst = max(worst, _relative(y, block.reference(x, full)))
                gears = _gathered(check, size, gear)
                if len(set(gears)) > 1:
                    differed += 1
                    results.put(("step", rank, step, gears))
                    break
                time.sleep(pause)
        results.put(("done", rank, step + 1, worst, differed))
    except BaseException as e:
        results.put(("error", rank, step, f"{type(e).__name__}: {str(e)[:300]}"))
        sys.exit(1)


def grouped(rank: int, size: int, port: int, seed: int, steps: int, namespace: str,
            pause: float, slow: float, restart: int, crash: int, results) -> None:
    """The positive run: every rank declares the group (rank and size from torch.distributed)
    and drives its runner through `GroupRank`; rank 0 is the driver: each step it announces
    the boundary's maintenance and plans the step, and the engine's own broadcast (a third
    gloo communicator) carries both to every rank, which maintains then replays exactly that.
    The last rank's captures are `slow` seconds slower (a sleep before each). At step
    `restart` (-1: never) the last rank's gearshift side is replaced, as a restarted process's
    would be: its client closed, a new one connected, a new runner holding nothing (the gloo
    communicator stays: the harness cannot replace one rank of it, so the new runner's padding
    probe, run while the others step, runs the shard without its all-reduces). At step `crash` (-1:
    never) rank 0 reports ("crash", 0, step): the test kills the controller and starts
    another. The "done" report's stats are the last `GroupRank`'s, with how many distinct
    snapshot versions were carried in turn, the steps this rank's own snapshot was another
    version than the carried one, and the steps after both faults that replayed a graph."""
    step = -1
    try:
        check = _join(rank, size, port)
        engine = dist.new_group(backend="gloo")  # the engine's step broadcast
        full = block.weights(seed)
        mine = block.shard(full, rank, size)

        alone = [False]  # while a replaced rank's runner probes its function on its own

        def fn(x: torch.Tensor) -> torch.Tensor:
            return block.forward(x, mine, None if alone[0] else dist.group.WORLD)

        worst, differed, planned, versions, lagged, late = 0.0, 0, set(), [], 0, 0
        client, group = _member(namespace, rank, size, fn, slow)
        try:
            for step, n in enumerate(traffic(seed, steps)):
                if step == restart and rank == size - 1:
                    client.close()
                    alone[0] = True
                    client, group = _member(namespace, rank, size, fn, slow)
                    alone[0] = False
                    _rejoin(group)
                if step == restart:
                    dist.barrier(group=engine)  # the engine re-forms its group
                if step == crash and rank == 0:
                    results.put(("crash", rank, step))
                said: list = [None]
                if rank == 0:
                    m = group.boundary()
                    said = [(n, group.plan(SEQLEN=n), m.carried() if m else None)]
                dist.broadcast_object_list(said, src=0, group=engine)
                n, carried, maintenance = said[0]
                if maintenance is not None:
                    group.maintain(Maintenance.of(maintenance, 1))
                x = inputs(seed, step, n)
                lagged += client.region.version() != carried[0]
                y = group.replay(carried, {"x": x})
                worst = max(worst, _relative(y, block.reference(x, full)))
                planned.add(tuple(sorted(group.usable())))
                late += step > max(restart, crash) and any(carried[1:])
                if not versions or versions[-1] != carried[0]:
                    versions.append(carried[0])
                gears = _gathered(check, size, carried[1])
                if len(set(gears)) > 1:
                    differed += 1
                    results.put(("step", rank, step, gears))
                time.sleep(pause)
        finally:
            client.close()
        results.put(("done", rank, steps, worst, differed,
                     {**group.stats, "usable sets": len(planned),
                      "versions": len(versions), "lagged": lagged, "late": late}))
    except BaseException as e:
        results.put(("error", rank, step, f"{type(e).__name__}: {str(e)[:300]}"))
        sys.exit(1)


def _rejoin(group: GroupRank) -> None:
    """Wait, as an engine's re-initialization of a replaced rank would, until the rank is
    registered and the controller has published that it holds nothing (its device's snapshot:
    every rank reported, nothing usable); RuntimeError after REJOIN_SECONDS."""
    end = time.monotonic() + REJOIN_SECONDS
    region = group.client.region
    while time.monotonic() < end:
        group.report()
        snap = region.read() if region.version() > 0 else None
        if snap is not None and protocol.profile_reported(snap.payload, "tp") and (
                protocol.profile_usable(snap.payload, "tp") == frozenset()):
            return
        time.sleep(0.01)
    raise RuntimeError(f"the replaced rank was not caught up in {REJOIN_SECONDS} s")


def _member(namespace: str, rank: int, size: int, fn: Callable[..., torch.Tensor], slow: float
            ) -> tuple[Client, GroupRank]:
    """A client of `namespace` for device `rank`, its grouped profile and a `GroupRank` of a
    new runner of `fn` (the last rank's captures `slow` seconds slower)."""
    client = gs.connect(namespace, device=rank)
    prof = client.profile("tp", {"SEQLEN": gs.Dim(max=MAX_TOKENS)}, group=gs.group("tp"))
    example = {"x": torch.zeros(MAX_TOKENS, block.HIDDEN, dtype=block.DTYPE)}
    runner = AdaptiveRunner(Transform(fn, prof.dims, {"x": ("S", None)}, outputs=("S", None)),
                            example, replays=0)
    if slow and rank == size - 1:
        capture = runner.capture

        def slowly(variants: list) -> int:
            time.sleep(slow)
            return capture(variants)

        runner.capture = slowly
    return client, GroupRank(client, prof, runner)
