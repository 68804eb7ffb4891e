"""The demo's arms tensor parallel (`--tp N`): the ranks of one instance step together (torch).

An instance is N worker processes, ranks of one gloo process group (`tp.join`), each running
its shard of the Llama (`tp.ShardedLlama`). Its rank 0, the driver, takes the merged rows from
the arm's shared counter; each step it broadcasts a message on the engine's communicator, as a
tensor-parallel engine broadcasts its scheduler's output: `(j, carried, maintenance)`, merged
row j (`TICK` none, `DONE` the end of a settle, the slice's `end` the end of the slice), the
`GroupRank.plan` of the row (adaptive arm) and each profile's `Maintenance.carried()`, if any.
Every rank, the driver included, runs the maintenance, then the row, so the same request sizes
reach every rank at the same step.

- `LockstepArm`, the static arm: each rank's runner pads to its initial gears, the same on
  every rank (the ladder: a pure function of the size).
- `GroupedArm`, the adaptive arm: each profile declared with the instance's group
  (`gs.group(name, rank, N)`) and its runner driven by a `GroupRank`: the driver announces the
  captures and releases at step boundaries and plans the step, every rank replays exactly
  what is carried. `settle` (between slices) announces boundaries until every gear in use is
  captured and usable, within SETTLE_SECONDS.

After every step the ranks all-gather, on the check communicator (outside gearshift and outside
the model's), the row and what the model's function saw (`ShardedLlama.seen`: its calls and
padded rows); a step where they differ counts in `differed`. Every CHECK_EVERY-th merged row
(the same rows in both arms), the driver compares the step's output with the unsharded model
(`llama.DemoLlama`, same seed) on the unpadded input: `worst` relative error, `mismatched`
beyond TOLERANCE. The check's CPU seconds are left out of the slice's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from contextlib import nullcontext
from itertools import product
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import gearshift as gs
from gearshift.core.dims import Dim
from gearshift.tools.demo.arm import Arm, Lane, Model, Runner, runner_for
from gearshift.tools.demo.tp import Communicators, gathered
from gearshift.worker import Client, GroupRank, Maintenance

TICK, DONE = -1, -2  # a message with no row: maintenance only; the end of a settle
CHECK_EVERY = 8  # merged rows: the driver checks rows 0, 8, 16, ... against the reference
TOLERANCE = 1e-5  # relative (max abs difference over max abs value): float32 sums, reordered
SETTLE_SECONDS = 30.0  # a settle ends by then even if some gear never became usable
SETTLE_POLL = 0.005  # seconds between the driver's looks at the usable set while settling

Message = tuple[int, Any, dict[str, tuple[int, ...]] | None]


class Lockstep:
    """One rank's side of an instance's steps: the broadcast, the check, their counts."""

    def __init__(self, comms: Communicators, reference: Model | None) -> None:
        self.comms, self.reference = comms, reference  # the unsharded model: the driver's
        self.driver = comms.rank == 0
        self.check_cpu = 0.0
        self.clear()

    def clear(self) -> None:
        self.steps = self.differed = self.checked = self.mismatched = 0
        self.worst = 0.0

    def say(self, message: Message | None) -> Message:
        """The driver's `message`, on every rank (the engine's step broadcast)."""
        box = [message]
        dist.broadcast_object_list(box, src=0, group=self.comms.engine)
        return box[0]

    def agree(self, j: int, seen: list[int]) -> None:
        """All-gather the step's row and what the function saw; count a step that differed."""
        every = gathered(self.comms.check, self.comms.size, [j, *seen])
        self.steps += 1
        self.differed += any(v != every[0] for v in every)

    def verify(self, lane: Lane, i: int) -> None:
        """The driver: lane's last output against the unsharded model on row i, unpadded."""
        began = time.thread_time()
        with torch.no_grad():
            want = self.reference.forward(**lane.inputs[i])  # type: ignore[union-attr]
        error = float((lane.output - want).abs().max() / want.abs().max().clamp_min(1e-30))
        self.checked += 1
        self.mismatched += not error <= TOLERANCE
        self.worst = max(self.worst, error)
        self.check_cpu += time.thread_time() - began

    def figures(self) -> dict[str, Any]:
        """The counts since the last call: steps, steps whose gears differed, outputs checked,
        those beyond TOLERANCE, the worst relative error; then starts anew."""
        out = {"steps": self.steps, "differed": self.differed, "checked": self.checked,
               "mismatched": self.mismatched, "worst_error": self.worst}
        self.clear()
        return out


class LockstepArm(Arm):
    """An arm whose rows the instance's driver takes and broadcasts (module docstring)."""

    def __init__(self, lanes: Mapping[str, Lane], which: np.ndarray, local: np.ndarray,
                 report: Callable[[int, int, int], None] = lambda *_: None, *,
                 step: Lockstep) -> None:
        super().__init__(lanes, which, local, report)  # seeded inputs: the same on every rank
        self.step = step

    def plan(self, j: int, end: int) -> Message:
        """The driver's message for merged row j (`end`: none left)."""
        return j, None, None

    def apply(self, message: Message) -> None:
        """Run what `message` carries before its row (here: nothing)."""

    def next(self, take: Callable[[int], int], end: int) -> int:
        message = self.plan(take(end), end) if self.step.driver else None
        message = self.step.say(message)
        self.apply(message)
        return message[0]

    def run(self, lane: Lane, i: int, j: int) -> tuple[int, int]:
        model = lane.model
        model.seen = [0, 0]  # type: ignore[attr-defined]
        done = lane.run(i)
        self.step.agree(j, model.seen)  # type: ignore[attr-defined]
        if self.step.driver and j % CHECK_EVERY == 0:
            self.step.verify(lane, i)
        return done

    def replay(self, take: Callable[[int], int], end: int) -> dict[str, Any]:
        before = self.step.check_cpu
        out = super().replay(take, end)
        checking = self.step.check_cpu - before
        out["cpu"] -= checking
        out["thread_cpu"] -= checking
        out["lockstep"] = self.step.figures()
        return out


class GroupedLane(Lane):
    """A lane whose requests run through a `GroupRank` on the carried variant."""

    group: GroupRank

    def call(self, tensors: dict[str, torch.Tensor], route: Any) -> Any:
        return self.group.replay(route, tensors)


class GroupedArm(LockstepArm):
    """The adaptive arm of a rank: per profile (`profiles`: name -> its dims and its rows'
    sizes) a grouped profile of `client` (group `name`, this rank of the instance) and a
    `GroupRank` of a runner (`runner`) of the profile's model (`model(name)`: the static
    arm's shard of that profile)."""

    def __init__(self, client: Client,
                 profiles: Mapping[str, tuple[Mapping[str, Dim], Mapping[str, np.ndarray]]],
                 which: np.ndarray, local: np.ndarray,
                 report: Callable[[int, int, int], None], model: Callable[[str], Model],
                 runner: Callable[[Model, Mapping[str, Dim]], Runner] = runner_for, *,
                 step: Lockstep, name: str) -> None:
        self.client, self.carried = client, None
        self.groups: dict[str, GroupRank] = {}
        group = gs.group(name, step.comms.rank, step.comms.size)
        lanes = {}
        for k, (p, (dims, sizes)) in enumerate(profiles.items()):
            m = model(p)
            profile = client.profile(p, dims, lazy_start=False, group=group)
            r = runner(m, dims)
            lanes[p] = lane = GroupedLane(m, r, self._route, sizes, seed=k)  # initial gears
            lane.group = self.groups[p] = GroupRank(client, profile, r)
        self.profile_of = {id(lane): p for p, lane in lanes.items()}
        super().__init__(lanes, which, local, report, step=step)

    def _route(self, i: int, request: dict[str, int]) -> Any:
        """The carried variant as the lane's route, with the padded work it runs."""
        gears = self.carried[1:]
        return nullcontext(([g or n for g, n in zip(gears, request.values(), strict=True)],
                            self.carried))

    def plan(self, j: int, end: int) -> Message:
        self.client._refresh()  # the driver adopts the newest snapshot at each boundary
        boundaries = {p: m.carried() for p, g in self.groups.items()
                      if (m := g.boundary()) is not None}
        carried = None
        if 0 <= j < end:
            lane, i = self.order[j]
            carried = self.groups[self.profile_of[id(lane)]].plan(
                **dict(zip(lane.names, lane.rows[i], strict=True)))
        return j, carried, boundaries or None

    def apply(self, message: Message) -> None:
        self.carried = message[1]
        for p, ints in (message[2] or {}).items():
            group = self.groups[p]
            group.maintain(Maintenance.of(ints, len(group.dims)))

    def settle(self) -> None:
        """Every rank: step boundaries without rows until the driver sees every gear in use
        held and usable (or SETTLE_SECONDS pass); what each rank holds is reported."""
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            message = None
            if self.step.driver:
                boundaries = self.plan(TICK, 0)[2]
                done = (boundaries is None and self._usable()) or time.monotonic() > deadline
                message = (DONE if done else TICK, None, boundaries)
            message = self.step.say(message)
            self.apply(message)
            for group in self.groups.values():
                group.report()
            if message[0] == DONE:
                return
            if message[2] is None:
                time.sleep(SETTLE_POLL)

    def _usable(self) -> bool:
        """Whether every variant of every profile's gears in use is usable (the driver's
        view: the group's snapshot, what it holds)."""
        for group in self.groups.values():
            gears = group.profile.gears
            if not set(product(*(gears[d] for d in group.dims))) <= group.usable():
                return False
        return True
