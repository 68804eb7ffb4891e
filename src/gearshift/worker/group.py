"""One rank's side of a grouped profile: the driver's plan and boundaries, every rank's replay
and lockstep maintenance (docs/architecture.md, "Tensor parallel").

`GroupRank(client, profile, runner)` drives `runner` for a profile declared with a group; the
runner is not attached to the profile, so the client's swap thread never captures, warms up or
releases its graphs: all of that happens in `maintain`, on the engine's thread, at the step
boundaries the driver announces. Each step:

- the driver (one rank, usually rank 0) calls `boundary()` (a `Maintenance` or None: the
  gears to release and the variants to capture, largest first) and `plan(**sizes)` (a
  `Carried`: the variant the step runs on, 0s for an eager run); both are short tuples of
  ints, which the engine puts in the step broadcast it already makes;
- every rank, the driver included, calls `maintain(maintenance)` when there is one, then
  `replay(carried, tensors)`.

The plan is a pure function of the sizes and the variants usable at the driver (what every rank
reported holding, as the group's snapshot says, and what the driver holds now); `replay` runs
exactly the carried variant or raises GroupError before running anything when this rank does not
hold it. A grouped request runs on one variant or eagerly, never cut into chunks. After each
maintenance a rank reports what it holds, with its epoch and count of maintenances (the
`Maintenance` docstring), to the controller (`protocol.holds_message`, sent
again on later calls until the mailbox takes it, and every REPORT_SECONDS). Not thread-safe:
one engine thread per rank calls it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import product
from typing import Any

from gearshift import protocol
from gearshift.core.group import Group, Variant
from gearshift.errors import GroupError, PayloadError, ShapeError
from gearshift.worker.interfaces import Runner
from gearshift.worker.profile import Profile
from gearshift.worker.session import Client

log = logging.getLogger(__name__)

Carried = tuple[int, ...]  # (snapshot version, gear per dim); all gears 0: eager
CAPTURES_PER_BOUNDARY = 2  # captures announced at one boundary: a step waits for at most these
REPORT_SECONDS = 5.0  # what a rank holds is sent again this often (a restarted controller)


@dataclass(frozen=True)
class Maintenance:
    """What every rank runs at one step boundary, in this order: when `reset` (an epoch, > 0;
    0: no reset), it drops every graph it holds and forgets which gears passed the padding
    probe (a rank lacked what the others held: every rank starts again from the same state)
    and enters epoch `reset`; then `releases` ((dim index, gear): every variant of that gear);
    then `captures` (variants). Every rank counts the maintenances it ran since its epoch's
    reset (the same broadcast on every rank: the counts agree) and reports (epoch, count)
    with what it holds."""

    captures: tuple[Variant, ...]
    releases: tuple[tuple[int, int], ...]
    reset: int = 0

    def carried(self) -> tuple[int, ...]:
        """As ints: reset (the epoch, or 0), the count of captures, their gears, the count of
        releases, their pairs."""
        return (int(self.reset), len(self.captures), *(g for v in self.captures for g in v),
                len(self.releases), *(x for r in self.releases for x in r))

    @classmethod
    def of(cls, ints: tuple[int, ...] | list[int], ndim: int) -> Maintenance:
        """The maintenance `carried()` gave; GroupError when `ints` are not such."""
        try:
            reset, n, at = int(ints[0]), int(ints[1]), 2
            captures = tuple(tuple(int(g) for g in ints[at + i * ndim: at + (i + 1) * ndim])
                             for i in range(n))
            at += n * ndim
            m = int(ints[at])
            releases = tuple((int(ints[at + 1 + 2 * i]), int(ints[at + 2 + 2 * i]))
                             for i in range(m))
            if at + 1 + 2 * m != len(ints) or any(len(v) != ndim for v in captures) or not (
                    0 <= reset <= protocol.MAX_MARK):
                raise IndexError
        except (IndexError, TypeError, ValueError):
            raise GroupError(f"not a carried maintenance of {ndim} dims (reset: an epoch in "
                             f"[0, {protocol.MAX_MARK}]): {list(ints)[:20]}") from None
        return cls(captures, releases, reset)


class GroupRank:
    """`runner` of grouped `profile` of `client`, driven in lockstep (module docstring)."""

    def __init__(self, client: Client, profile: Profile, runner: Runner,
                 captures_per_boundary: int = CAPTURES_PER_BOUNDARY) -> None:
        if profile.group is None:
            raise GroupError(f"profile {profile.name!r} declares no group (client.profile(..., "
                             "group=gs.group(NAME)))")
        if list(runner.gears) != list(profile.dims):
            raise ShapeError(f"{profile.name}: the runner's dims {list(runner.gears)} are not "
                             f"{list(profile.dims)} (in this order)")
        self.client, self.profile, self.runner = client, profile, runner
        self.group: Group = profile.group
        self.dims = list(profile.dims)
        self.per_boundary = captures_per_boundary
        self.stats = {"captured": 0, "capture_failures": 0, "released": 0, "replays": 0,
                      "eager": 0, "resets": 0}
        self._unreported = True
        self._reported_ns = 0  # when the last report was sent
        self._seen, self._usable, self._reported = -1, frozenset(), False
        self._replaced: int | None = None  # the snapshot's count of replaced ranks, last seen
        # a rank's process is new: the count grew since the last boundary, or this driver is
        # new (its first boundary: followers may hold graphs and probes of a driver replaced)
        self._rejoined = True
        self._first = True
        self._confirmed: set[Variant] = set()  # held, and seen usable since their capture
        self._epoch, self._count = 0, 0  # the last reset's epoch, the maintenances since
        self._captured: dict[Variant, int] = {}  # the count that captured each, this epoch
        self._failed: set[Variant] = set()  # its capture failed here: not announced again
        self._at: tuple[int, int] | None = None  # the snapshot's (epoch, least count)
        self._releasing: frozenset[tuple[int, int]] = frozenset()  # announced, not yet run

    # the driver

    def usable(self) -> frozenset[Variant]:
        """The variants the driver may plan: the group's usable set (its snapshot) that this
        rank still holds, less those the last announced boundary releases (the step it plans
        runs after that boundary), and only those that every rank's report shows held after
        their last capture: the snapshot's `at` (every rank's last report of this epoch, the
        least count among them) is of this rank's epoch and at or past the count of the
        maintenance that captured them. A rank's report from before a release would otherwise
        list a gear it failed to capture again."""
        region = self.client.region
        version = region.version()
        if version != self._seen:
            try:
                snap = region.read()
            except PayloadError:
                snap = None
            usable = protocol.profile_usable(snap.payload, self.profile.name) if snap else None
            self._seen, self._usable = version, usable or frozenset()
            self._at = protocol.profile_usable_at(snap.payload, self.profile.name) if (
                snap is not None) else None
            self._reported = snap is not None and protocol.profile_reported(
                snap.payload, self.profile.name)
            replaced = protocol.profile_replaced(snap.payload, self.profile.name) if (
                snap is not None) else None
            if replaced is not None:  # fewer: a restarted controller counts anew
                self._rejoined |= self._replaced is not None and replaced > self._replaced
                self._replaced = replaced
        held = self._usable & frozenset(self.runner.ready())
        at = self._at
        if at is None or at[0] != self._epoch:
            held = frozenset()
        else:
            held = frozenset(v for v in held if self._captured.get(v, 0) <= at[1])
        self._confirmed |= held
        if self._releasing:
            held = frozenset(v for v in held if not any((i, g) in self._releasing
                                                        for i, g in enumerate(v)))
        return held

    def plan(self, **sizes: int) -> Carried:
        """The variant this step runs on: the smallest usable one covering `sizes` (fewest
        padded elements, then the lowest gears), all 0s when none does (eager)."""
        need = tuple(int(sizes[d]) for d in self.dims)
        covering = [v for v in self.usable() if all(map(int.__ge__, v, need))]
        best = min(covering, key=lambda v: (math.prod(v), v), default=(0,) * len(self.dims))
        return (self._seen, *best)

    def boundary(self) -> Maintenance | None:
        """What every rank should run at this boundary: the gears this rank holds that are no
        longer in use, and up to `per_boundary` variants of the profile's gears in use that it
        does not hold (largest first); None when there is nothing.

        When a rank's process was replaced (the snapshot's count of replaced ranks grew), or
        some rank lacks what this one holds (every rank has reported and a variant that was
        usable since this rank captured it is usable no more), every rank releases all it holds
        and forgets its padding probes, and the group recaptures its gears together, largest
        first: a rank that kept a graph, or the record that a gear passed its probe, would skip
        a warm-up, capture or probe the new rank runs, and their collectives would not match.
        This holds whatever was usable: a rank replaced before anything was usable lacks the
        graphs and probes the others kept as much as one replaced later. A driver's first
        boundary resets too (the driver may be the rank replaced; at a group's start it drops
        nothing), and is not counted in `stats["resets"]`. A reset carries a new epoch: above
        this rank's last and at least its clock's now in ns (a monotonic clock is system-wide:
        a replaced driver's epochs exceed its predecessor's), so a report of an earlier epoch
        never counts in this one."""
        self.usable()  # reads the group's snapshot
        gears = self.profile.gears
        held = set(self.runner.ready())
        lost = self._rejoined or (self._reported and bool((self._confirmed & held) - self._usable))
        self._rejoined = False
        if lost and not self._first:
            log.warning("group %r: a rank is new or lacks gears this driver holds; every rank "
                        "recaptures the group's gears", self.group.name)
            self.stats["resets"] += 1
        self._first = False
        epoch = max(self._epoch + 1, self.client.clock.now_ns()) if lost else 0
        if lost:
            releases, held = [], set()
        else:  # what failed here may be held by the others: released with the group's gears
            releases = sorted({(i, v[i]) for v in held | self._failed
                               for i, d in enumerate(self.dims) if v[i] not in gears[d]})
        wanted = sorted((v for v in product(*(gears[d] for d in self.dims))
                         if v not in held and (lost or v not in self._failed)),
                        key=lambda v: (math.prod(v), v), reverse=True)[:self.per_boundary]
        self._releasing = frozenset(releases)
        if lost:
            self._releasing = frozenset((i, v[i]) for v in self.runner.ready()
                                        for i in range(len(self.dims)))
        return Maintenance(tuple(wanted), tuple(releases), epoch) if (
            wanted or releases or lost) else None

    # every rank

    def maintain(self, maintenance: Maintenance) -> None:
        """Release, then capture, what `maintenance` says, on this (the engine's) thread, then
        report what this rank holds. A capture that fails (any exception) is logged and left
        out: the rank does not hold it, so it never becomes usable, and the others keep theirs
        unrouted until it leaves the group's gears and every rank releases it together. It is
        not announced again meanwhile: not while the driver holds it, nor when the failure was
        the driver's own (the others, holding it, would skip the capture and leave the driver
        alone in its collectives); the release that comes when it leaves the gears is
        announced from the driver's failures too. A failure is survivable only
        where the failing rank issued the collectives the others did (a failure after the
        capture ran); one that skips them leaves the communicator out of step, which the
        engine's collective timeout reports. A reset enters its epoch, counted from 0; every
        maintenance counts one, and what it captures is marked with that count."""
        if maintenance.reset:
            self._epoch, self._count = maintenance.reset, 0
            self._captured.clear()
            self._failed.clear()
            for gear in sorted({v[0] for v in self.runner.ready()}):
                self.stats["released"] += self.runner.release(self.dims[0], gear)
            forget = getattr(self.runner, "forget_probes", None)
            if forget is not None:
                forget()
        self._count += 1
        for dim, gear in maintenance.releases:
            self.stats["released"] += self.runner.release(self.dims[dim], gear)
            self._failed = {v for v in self._failed if v[dim] != gear}
        self._confirmed &= set(self.runner.ready())
        for variant in maintenance.captures:
            try:
                self.stats["captured"] += self.runner.capture([dict(zip(self.dims, variant,
                                                                        strict=True))])
            except Exception as e:  # a backend's too (out of memory): the rank lacks it
                self.stats["capture_failures"] += 1
                self._failed.add(variant)
                log.warning("group %r rank %d: capturing %s failed: %s", self.group.name,
                            self.group.rank, variant, e)
            self._confirmed.discard(variant)
            self._captured[variant] = self._count
        self._releasing = frozenset()
        self._unreported = True
        self.report()

    def replay(self, carried: Carried, tensors: Mapping[str, Any],
               recorded: Mapping[str, int] | None = None) -> Any:
        """Run the step on exactly the carried variant, or eagerly when it is all 0s;
        GroupError at once when this rank does not hold it. The step is recorded as a request
        of `recorded` (default: the tensors' sizes; with data-parallel attention, the max the
        driver planned: what the group's gears must fit)."""
        self.report()
        variant = tuple(int(g) for g in carried[1:])
        if len(variant) != len(self.dims):
            raise GroupError(f"carried {list(carried)[:8]} has not one gear per dim {self.dims}")
        runner = self.runner
        sizes = runner.transform.check(tensors)
        eager = not any(variant)
        if not eager:
            if variant not in set(runner.ready()):
                raise GroupError(
                    f"group {self.group.name!r} rank {self.group.rank}: told to replay "
                    f"{dict(zip(self.dims, variant, strict=True))} (snapshot {carried[0]}), "
                    f"which it does not hold; it holds {sorted(runner.ready())[:8]}")
            if any(sizes[d] > g for d, g in zip(self.dims, variant, strict=True)):
                raise GroupError(f"sizes {dict(sizes)} exceed the carried {variant}")
        with self.profile.request(**(sizes if recorded is None else recorded)):
            if eager:
                self.stats["eager"] += 1
                return runner.transform.call(tensors, sizes)
            runner.gears = {d: (g,) for d, g in zip(self.dims, variant, strict=True)}
            self.stats["replays"] += 1
            return runner.run(tensors, sizes)

    def report(self) -> None:
        """Send what this rank holds after a change, at once after each registration (a
        restarted controller knows nothing of it: the profile registers again), and every
        REPORT_SECONDS, once the profile is registered. `maintain` and `replay` call it; an
        engine may call it while idle (a restarted rank, before it rejoins the steps)."""
        if not self.profile.registered:
            self._unreported = True
            return
        now = self.client.clock.now_ns()
        if not self._unreported and now - self._reported_ns < REPORT_SECONDS * 1e9:
            return
        held = sorted(self.runner.ready(), key=lambda v: (math.prod(v), v))[:protocol.MAX_HELD]
        message = protocol.holds_message(self.profile.id, held, self._epoch, self._count)
        if self.client._registrations.send(message):
            self._unreported, self._reported_ns = False, now
