"""Bodies of the gloo harness's rank processes (importable by multiprocessing's forkserver,
which preloads torch and gearshift: tests/conftest.py `mp`).

Every rank joins a gloo process group of `size` ranks on 127.0.0.1:`port`, with collectives
bounded by COLLECTIVE_SECONDS, and a second gloo group of its own for the harness's check: each
step's chosen gear is all-gathered there, outside gearshift and outside the model's
communicator (a grouped rank has a third, the engine's step broadcast). Each rank reports to
`results` (a queue): ("step", rank, step, gears of every rank) when gears differ, ("done",
rank, steps, worst relative error, steps whose gears differed[, stats]) at the end, or
("error", rank, step, what) before it exits 1; a grouped run's faults add theirs (`Run`).
"""

from __future__ import annotations

import datetime
import random
import sys
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field

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
REGION_SECONDS = 1.0  # a timed run's traffic shifts this often
REGIONS = ((1, 4), (5, 8), (9, 16), (17, 32), (33, 64), (1, 64), (12, 20), (40, 48))
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


def _join(rank: int, size: int, port: int, seconds: float = COLLECTIVE_SECONDS
          ) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
    """Join the model's communicator (the world) and return the check's and the engine's."""
    torch.set_num_threads(1)  # one core a rank: the ranks share the machine's few
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=size, timeout=datetime.timedelta(seconds=seconds))
    return dist.new_group(backend="gloo"), dist.new_group(backend="gloo")


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
        check, _ = _join(rank, size, port)
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
        check, _ = _join(rank, size, port, HAZARD_SECONDS)
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


@dataclass(frozen=True)
class Run:
    """One grouped run (`grouped`). It ends after `steps` steps, or when `seconds` have passed
    at the driver (`steps` 0: the traffic then shifts, `shifting`). The last rank's captures
    are `slow` seconds slower (a sleep before each). At step `restart` the last rank's gearshift
    side is replaced (its process and communicator stay); at step `crash` rank 0 reports
    ("crash", 0, step) (the test kills the controller and starts another); at step `kill` the
    last rank reports ("kill", rank, step) and waits to be killed (the test SIGKILLs it and
    starts a `replacement` process), and the ranks re-form their communicator on port
    `reform`; the last rank's first capture at step `fail` or later raises after running (its
    collectives issued like every rank's, its graph dropped) and it reports ("failed", rank,
    step, gears). -1: never."""

    namespace: str
    steps: int = 0
    seconds: float = 0.0
    seed: int = 11
    pause: float = 0.01
    slow: float = 0.0
    restart: int = -1
    crash: int = -1
    kill: int = -1
    fail: int = -1
    reform: int = 0
    replacement: bool = False


def shifting(seed: int, elapsed: float, rng: random.Random) -> int:
    """The tokens of a step `elapsed` seconds into a timed run: uniform in a region of sizes
    drawn anew every REGION_SECONDS (from `seed`: the same regions every run of a seed)."""
    pick = random.Random(seed * 7919 + int(elapsed / REGION_SECONDS))
    return rng.randint(*REGIONS[pick.randrange(len(REGIONS))])


@dataclass
class Tally:
    """What one rank saw of a grouped run."""

    steps: int = 0
    worst: float = 0.0
    differed: int = 0
    lagged: int = 0  # steps its own snapshot was another version than the carried one
    late: int = 0  # steps after the faults that replayed a graph
    slowest: float = 0.0  # seconds of its slowest step (maintenance included)
    versions: list[int] = field(default_factory=list)  # carried versions, in turn
    gear_sets: list[tuple] = field(default_factory=list)  # its profile's gear sets, in turn
    usable_sets: list[tuple] = field(default_factory=list)  # the plannable sets, in turn
    usables: set[tuple] = field(default_factory=set)  # the distinct plannable sets
    routed: set[int] = field(default_factory=set)  # the carried gears (0: eager)

    def see(self, key: str, value: object) -> None:
        seen = getattr(self, key)
        if not seen or seen[-1] != value:
            seen.append(value)


def grouped(rank: int, size: int, port: int, run: Run, results) -> None:
    """The positive run: every rank declares the group (rank and size from torch.distributed)
    and drives its runner through `GroupRank`; rank 0 is the driver: each step it announces
    the boundary's maintenance and plans the step, and the engine's own broadcast (a third
    gloo communicator) carries the step, its size, both to every rank, which maintains then
    replays exactly that. Faults as `run` says; after the kill every survivor drops its
    communicators and re-forms them with the replacement, which registers and reports before
    it joins (as an engine's restarted rank re-initializes first), and the step that failed
    is served again. The "done" report's stats are the last `GroupRank`'s and the `Tally`'s."""
    step = -1
    try:
        full = block.weights(run.seed)
        mine = block.shard(full, rank, size)
        alone = [run.replacement]  # while a replaced rank's runner probes its function alone

        def fn(x: torch.Tensor) -> torch.Tensor:
            return block.forward(x, mine, None if alone[0] else dist.group.WORLD)

        client = group = None
        at = [-1, False]  # the step being served, whether a capture failed (`run.fail`)
        if run.replacement:
            client, group = _member(run, rank, size, fn, results, at)
            _rejoin(group)
            alone[0] = False
        check, engine = _join(rank, size, run.reform if run.replacement else port)
        if client is None:
            client, group = _member(run, rank, size, fn, results, at)
        tally, reformed = Tally(), run.replacement
        rng, began = random.Random(run.seed), time.monotonic()
        sizes = traffic(run.seed, run.steps) if run.steps else []
        try:
            while True:
                try:
                    if step + 1 == run.restart and rank == size - 1:
                        client.close()
                        alone[0] = True
                        client, group = _member(run, rank, size, fn, results, at)
                        alone[0] = False
                        _rejoin(group)
                    if step + 1 == run.restart:
                        dist.barrier(group=engine)  # the engine re-forms its group
                    if step + 1 == run.crash and rank == 0:
                        results.put(("crash", rank, step + 1))
                    if step + 1 == run.kill and rank == size - 1 and not run.replacement:
                        results.put(("kill", rank, step + 1))
                        time.sleep(4 * REJOIN_SECONDS)  # the test kills it
                    t0 = time.monotonic()
                    said: list = [None]
                    if rank == 0:
                        said = [_drive(group, run, step + 1, sizes, rng, t0 - began)]
                    dist.broadcast_object_list(said, src=0, group=engine)
                    at[0], n, carried, maintenance = said[0]
                    if n < 0:
                        break
                    _step(rank, size, run, client, group, check, full, tally, at[0], n,
                          carried, maintenance, results)
                    step = at[0]
                    tally.steps += 1
                    tally.slowest = max(tally.slowest, time.monotonic() - t0)
                    time.sleep(run.pause)
                except Exception as e:
                    if run.kill < 0 or reformed:
                        raise
                    reformed = True  # a peer died: re-form the communicators without it
                    results.put(("reforming", rank, step, sorted(group.runner.ready()),
                                 f"{type(e).__name__}: {str(e)[:120]}"))
                    dist.destroy_process_group()
                    check, engine = _join(rank, size, run.reform, REJOIN_SECONDS)
        finally:
            client.close()
        results.put(("done", rank, tally.steps, tally.worst, tally.differed,
                     {**group.stats, "usable sets": len(tally.usables),
                      "versions": len(tally.versions), "lagged": tally.lagged,
                      "late": tally.late, "slowest": tally.slowest,
                      "gear sets": tally.gear_sets, "usable changes": len(tally.usable_sets) - 1,
                      "routed": sorted(tally.routed)}))
        dist.destroy_process_group()
    except BaseException as e:
        results.put(("error", rank, step, f"{type(e).__name__}: {str(e)[:300]}"))
        sys.exit(1)


def _drive(group: GroupRank, run: Run, step: int, sizes: list[int], rng: random.Random,
           elapsed: float) -> tuple:
    """The driver's part of the step broadcast: (step, tokens, carried plan, carried
    maintenance), tokens -1 when the run is over."""
    if (run.steps and step >= run.steps) or (not run.steps and elapsed >= run.seconds):
        return (step, -1, None, None)
    n = sizes[step] if run.steps else shifting(run.seed, elapsed, rng)
    m = group.boundary()
    return (step, n, group.plan(SEQLEN=n), m.carried() if m else None)


def _step(rank: int, size: int, run: Run, client: Client, group: GroupRank,
          check: dist.ProcessGroup, full: block.Weights, tally: Tally, step: int, n: int,
          carried: tuple, maintenance: tuple | None, results) -> None:
    """One step on every rank: the carried maintenance, the carried replay, the output against
    the unsharded block, the gear all-gathered on the check's communicator."""
    if maintenance is not None:
        group.maintain(Maintenance.of(maintenance, 1))
    x = inputs(run.seed, step, n)
    tally.lagged += client.region.version() != carried[0]
    y = group.replay(carried, {"x": x})
    tally.worst = max(tally.worst, _relative(y, block.reference(x, full)))
    usable = tuple(sorted(group.usable()))
    tally.usables.add(usable)
    tally.routed.add(carried[1])
    tally.see("usable_sets", usable)
    tally.see("gear_sets", tuple(group.profile.gears["SEQLEN"]))
    tally.late += step > max(run.restart, run.crash, run.kill) and any(carried[1:])
    tally.see("versions", carried[0])
    gears = _gathered(check, size, carried[1])
    if len(set(gears)) > 1:
        tally.differed += 1
        results.put(("step", rank, step, gears))


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


def _member(run: Run, rank: int, size: int, fn: Callable[..., torch.Tensor], results,
            at: list) -> tuple[Client, GroupRank]:
    """A client of `run.namespace` for device `rank`, its grouped profile and a `GroupRank`
    of a new runner of `fn` (the last rank's captures slowed or failed as `run` says, `at`:
    the step being served and whether a capture failed)."""
    client = gs.connect(run.namespace, device=rank)
    declared = gs.group("tp", rank, size) if run.replacement else gs.group("tp")  # before
    prof = client.profile("tp", {"SEQLEN": gs.Dim(max=MAX_TOKENS)}, group=declared)  # init
    example = {"x": torch.zeros(MAX_TOKENS, block.HIDDEN, dtype=block.DTYPE)}
    runner = AdaptiveRunner(Transform(fn, prof.dims, {"x": ("S", None)}, outputs=("S", None)),
                            example, replays=0)
    if rank == size - 1 and (run.slow or run.fail >= 0):
        capture = runner.capture

        def hooked(variants: list) -> int:
            time.sleep(run.slow)
            done = capture(variants)
            if 0 <= run.fail <= at[0] and not at[1]:  # after its collectives: all matched
                at[1] = True
                for v in variants:
                    runner.release("SEQLEN", v["SEQLEN"])
                results.put(("failed", rank, at[0], [v["SEQLEN"] for v in variants]))
                raise RuntimeError("injected: out of memory while capturing")
            return done

        runner.capture = hooked
    return client, GroupRank(client, prof, runner)
