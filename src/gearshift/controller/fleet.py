"""A controller's part in a fleet: publish what it learned, read what the others learned.

`Fleet.tick(now)`, once a loop iteration, costs the loop a dict look-up until a sync is due:
every `fleet_publish_seconds` (and at `close`) the loop snapshots its ledgers (gears copied,
statistics by `DimStats.snapshot`, costs listed) and hands them to the fleet's thread, which
reads them at that `now`, encodes a generation (`fleetcodec`), publishes it and reads the
other nodes' (`fleetstore.Store`); the members of each profile identity (`core.fleet`) and
their prior come back to the loop at a later tick. The loop never waits on the store, except
at `first_read` (before the namespace is owned, at most `fleet_timeout_seconds`, so that the
first registrations already get the fleet's gears) and at `close` (the last publish, as long).

States (`state`): "off" (no URL), "joining" (no sync answered yet), "joined" (the last sync
succeeded), "alone" (it failed, or no answer in `fleet_timeout_seconds`: the node decides on
its own learning with the prior it last read, until it expires with its nodes' TTL, and
retries after a backoff that doubles from `fleet_publish_seconds` up to 16 times it). What
the node takes: `seed` (a new profile's start-up gears: `core.fleet.fleet_gears`), `prior`
(per profile of a device, the views to add to a round: `core.fleet.primed`, from when this
node first had the profile) and, once per new profile without measurements, the fleet's
measured costs into the cost book.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gearshift import threads
from gearshift.clock import Clock
from gearshift.controller.costbook import CostBook
from gearshift.controller.fleetcodec import Entry, Generation, encode
from gearshift.controller.fleetstore import Read, Store
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim, Gears
from gearshift.core.fleet import (
    Compact,
    FleetKey,
    Member,
    Prior,
    Views,
    disagreement,
    fleet_costs,
    fleet_gears,
    primed,
    prior_of,
)
from gearshift.core.round import DeviceLedger
from gearshift.core.stats import Histogram

log = logging.getLogger(__name__)

BACKOFF = 16  # the longest retry, in publish intervals


@dataclass
class _Learned:
    """What one read gave: per identity its members and prior; the nodes seen."""

    members: dict[str, list[Member]] = field(default_factory=dict)
    priors: dict[str, Prior] = field(default_factory=dict)
    read: Read = field(default_factory=Read)
    wall: float = 0.0


class Fleet:
    """One controller's fleet (module docstring); `Fleet(None, ...)` is "off"."""

    def __init__(self, store: Store | None, node: str, key: FleetKey, policy: PolicyConfig,
                 clock: Clock, wall: Clock, interval: float = 60.0, ttl: float = 600.0,
                 timeout: float = 10.0) -> None:
        self.store, self.node, self.key, self.policy = store, node, key, policy
        self.clock, self.wall = clock, wall
        self.devices: Mapping[int, DeviceLedger] = {}
        self.costs = CostBook()
        self.interval, self.ttl, self.timeout = interval, ttl, timeout
        self.state = "off" if store is None else "joining"
        self.reason = ""
        self.counts = {"publishes": 0, "reads": 0, "failures": 0, "bad_objects": 0}
        self.learned = _Learned()
        self.last_publish: float | None = None  # wall clock
        self.last_read: float | None = None
        self.joined: dict[tuple[int, str], float] = {}
        self._next = -math.inf
        self._failures = 0
        self._job: _Sync | None = None
        self._warned: set[str] = set()

    # -- life cycle --

    def attach(self, devices: Mapping[int, DeviceLedger], costs: CostBook) -> Fleet:
        """Publish `devices` (the controller's ledgers) and `costs`, and price them; returns
        this fleet."""
        self.devices, self.costs = devices, costs
        return self

    def first_read(self) -> None:
        """The first read, waited for at most `timeout` (the controller's start)."""
        if self.store is not None:
            self._begin(self.clock.now(), publish=False)
            self._finish(wait=self.timeout)
            log.info("fleet %s as node %s: %s, %d other live nodes", self.url, self.node,
                     self.state, len(self.learned.read.generations))

    def restored(self, now: float) -> None:
        """Profiles restored from the state file with a window's evidence of their own take no
        prior; the others joined `now`."""
        for device, dev in self.devices.items():
            for name, p in dev.profiles.items():
                own = min((s.view(now).total_count for s in p.stats.values()), default=0)
                self.joined[(device, name)] = (-math.inf if own >= self.policy.min_window_events
                                               else now)

    def close(self, now: float) -> None:
        """The last publish, waited for at most `timeout` (after any sync in flight)."""
        if self.store is None:
            return
        if self._job is not None:
            self._finish(wait=self.timeout)
        if self._job is None:
            self._begin(now, publish=True, read=False)
            self._finish(wait=self.timeout)

    # -- the loop --

    def tick(self, now: float) -> None:
        """Once a loop iteration: collect a sync, note a slow one, start one when due."""
        if self.store is None:
            return
        for device, dev in self.devices.items():
            for name in dev.profiles:
                if (device, name) not in self.joined:
                    self.joined[(device, name)] = now
                    self._take_costs(device, name, dev)
        if self.state == "alone" and self.learned.read.generations and (
                self.wall.now() - self.learned.wall > self.ttl):
            self.learned = _Learned()  # what it last read expired with its nodes
        if self._job is not None:
            self._finish(wait=0.0)
            if self._job is not None and now - self._job.began > self.timeout:
                self._alone(f"the store gave no answer in {self.timeout:g} s")
            return
        if now >= self._next:
            self._begin(now, publish=True)

    def _begin(self, now: float, publish: bool, read: bool = True) -> None:
        entries = self._snapshot() if publish else []
        self._job = _Sync(self, now, self.wall.now(), entries if publish else None, read)
        threads.start(self._job)

    def _finish(self, wait: float) -> None:
        job = self._job
        assert job is not None
        job.join(wait)
        if job.is_alive():
            if wait > 0:
                self._alone(f"the store gave no answer in {wait:g} s")
            return
        self._job = None
        if job.published:
            self.counts["publishes"] += 1
            self.last_publish = job.wall
        if job.learned is not None:
            self.counts["reads"] += 1
            self.last_read = job.wall
            self.learned = job.learned
            for node, why in job.learned.read.bad:
                why = self.store.scrub(why) if self.store is not None else why
                self.counts["bad_objects"] += 1
                self._warn(f"{node}: {why}", "fleet object of node %s ignored: %s", node, why)
        if job.error is not None:
            self._alone(f"{type(job.error).__name__}: {str(job.error)[:200]}")
            return
        self.state, self.reason, self._failures = "joined", "", 0
        self._next = job.began + self.interval

    def _alone(self, why: str) -> None:
        why = self.store.scrub(why) if self.store is not None else why
        if self.state != "alone" or why != self.reason:
            log.warning("fleet store %s: %s; running alone, retrying", self.url, why)
        self.counts["failures"] += 1
        self._failures += 1
        self.state, self.reason = "alone", why
        self._next = self.clock.now() + self.interval * min(2 ** (self._failures - 1), BACKOFF)

    def _warn(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned and len(self._warned) < 1024:
            self._warned.add(key)
            log.warning(message, *args)

    @property
    def url(self) -> str:
        return self.store.url if self.store is not None else ""

    # -- what the loop takes --

    def _members(self, name: str, dims: Mapping[str, Dim]) -> tuple[str, list[Member]]:
        identity = self.key.identity(name, dims)
        return identity, self.learned.members.get(identity, [])

    def seed(self, device: int, name: str, dims: Mapping[str, Dim]) -> dict[str, Gears] | None:
        """The fleet's start-up gears of a profile new here (None: the fleet has none)."""
        return fleet_gears(self._members(name, dims)[1], dims, self.policy.max_gears_per_type)

    def prior(self, device: int, dev: DeviceLedger,
              now: float) -> dict[str, dict[str, Views]] | None:
        """Per profile of `dev`, what the fleet adds to a round at `now` (None: nothing)."""
        if not self.learned.priors:
            return None
        out = {}
        for name, p in dev.profiles.items():
            prior = self.learned.priors.get(self.key.identity(name, p.dims))
            joined = self.joined.get((device, name), now)
            if prior is not None and (views := primed(prior, joined, now, self.policy,
                                                      p.dims)):
                out[name] = views
        return out or None

    def _take_costs(self, device: int, name: str, dev: DeviceLedger) -> None:
        if any(self.costs.measurements(device, name).values()):
            return
        for dim, ms in fleet_costs(self._members(name, dev.profiles[name].dims)[1]).items():
            if dim in dev.profiles[name].dims:
                for m in ms:
                    self.costs.add(device, name, dim, m)

    def _snapshot(self) -> list[tuple[int, str, str, dict[str, Gears], dict[str, Any],
                                      dict[str, list[Any]]]]:
        """What a publish needs, taken on the loop: references and copies only."""
        return [(device, name, self.key.identity(name, p.dims), p.gear_lists(),
                 {d: s.snapshot() for d, s in p.stats.items()},
                 {d: list(ms) for d, ms in self.costs.measurements(device, name).items()})
                for device, dev in list(self.devices.items())
                for name, p in list(dev.profiles.items())]

    def view(self, now: float) -> dict[str, Any]:
        """The status document's `fleet`: the store, the state, when it last published and
        read, and per profile its members' gears side by side and how far they disagree."""
        wall = self.wall.now()
        ago = {k: None if t is None else round(wall - t, 3)
               for k, t in (("published_ago", self.last_publish), ("read_ago", self.last_read))}
        read = self.learned.read
        return {"url": self.url, "node": self.node, "state": self.state, "reason": self.reason,
                **ago, "nodes": len({g.node for g in read.generations}),
                "expired": len(read.expired), **self.counts,
                "profiles": profiles_view(read.generations)}


class _Sync(threading.Thread):
    """One publish (of `entries`, if given) and read, off the loop (a daemon: a store that
    never answers holds this thread only)."""

    def __init__(self, fleet: Fleet, now: float, wall: float,
                 entries: list[Any] | None, read: bool) -> None:
        super().__init__(name="gearshift-fleet", daemon=True)
        self.fleet, self.began, self.wall, self.entries, self.read = (fleet, now, wall, entries,
                                                                      read)
        self.published = False
        self.learned: _Learned | None = None
        self.error: Exception | None = None

    def run(self) -> None:
        f = self.fleet
        assert f.store is not None
        try:  # whatever the store raises: the loop runs alone and retries
            if self.entries:
                f.store.publish(f.node, encode(f.node, self.wall, _entries(
                    f.node, self.entries, self.began, f.policy)), self.wall)
                self.published = True
        except Exception as e:  # the read goes on: a publish too large still reads the others
            self.error = e
        try:
            if self.read:
                read = f.store.read(self.wall, f.ttl, skip=f.node)
                self.learned = _learn(read, self.began, self.wall, f.policy)
        except Exception as e:
            self.error = self.error or e


def profiles_view(generations: list[Generation], limit: int = 64) -> list[dict[str, Any]]:
    """Per profile identity (at most `limit`), its members' gears side by side (by
    "node" or "node/device" when the device is not 0) and per dim how far they disagree
    (`core.fleet.disagreement`)."""
    by: dict[str, list[tuple[str, Entry]]] = {}
    for g in generations:
        for e in g.entries:
            member = g.node if e.device == 0 else f"{g.node}/{e.device}"
            by.setdefault(e.identity, []).append((member, e))
    out = []
    for identity, entries in sorted(by.items())[:limit]:
        dims = sorted({d for _, e in entries for d in e.member.gears})
        out.append({"profile": entries[0][1].name, "key": identity.split("\n", 1)[0],
                    "members": [m for m, _ in entries],
                    "gears": {d: {m: list(e.member.gears.get(d, ())) for m, e in entries}
                              for d in dims},
                    "disagreement": {d: round(disagreement([e.member.gears[d] for _, e in entries
                                                            if d in e.member.gears]), 4)
                                     for d in dims}})
    return out


def _entries(node: str, raw: list[Any], now: float, policy: PolicyConfig) -> list[Entry]:
    out = []
    for device, name, identity, gears, stats, costs in raw:
        window = {d: Compact.of(s.view(now), now) for d, s in stats.items()}
        history = {d: Compact.of(s.history.view(now) if s.history is not None
                                 else Histogram.empty(), now) for d, s in stats.items()}
        out.append(Entry(identity, name, device,
                         Member(node, 0.0, {d: tuple(g) for d, g in gears.items()}, window,
                                history, costs)))
    return out


def _learn(read: Read, now: float, wall: float, policy: PolicyConfig) -> _Learned:
    members: dict[str, list[Member]] = {}
    for g in read.generations:
        for e in g.entries:
            members.setdefault(e.identity, []).append(e.member)
    priors = {i: p for i, ms in members.items() if (p := prior_of(ms, now, policy)) is not None}
    return _Learned(members, priors, read, wall)


def from_config(config: Any, policy: PolicyConfig, clock: Clock, wall: Clock) -> Fleet:
    """The fleet of a `ControllerConfig` ("off" without `fleet_url`), to `attach` to the
    controller's ledgers; ConfigError if no filesystem serves the URL (s3:// without the `s3`
    extra)."""
    store = Store(config.fleet_url) if config.fleet_url else None
    return Fleet(store, config.fleet_node_name, config.fleet_key, policy, clock, wall,
                 config.fleet_publish_seconds, config.fleet_ttl_seconds,
                 config.fleet_timeout_seconds)
