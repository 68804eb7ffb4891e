"""The controller's group rounds, on its loop: one decision per grouped profile.

Every check interval, each grouped profile (`controller.groups`) whose every rank is held by a
live worker is decided once (`core.group.decide_group`: the recorder's statistics, under the
least headroom of the ranks' devices); the round's gears become the profile's on every rank's
device and, when a gear changed, each of those devices' snapshots is published. A group with a
rank missing is *degraded* (`degraded`: its missing ranks): it gets no new gears, so that no
rank is asked to capture what a missing rank cannot, and keeps those it has. Before deciding,
a member device whose gears are not the recorder's (a rank that joined late, or a state file's
other gears) is given the recorder's and published, so that every rank's device holds the
group's one gear set. The device rounds leave a grouped profile alone (`ProfileLedger.group`,
set here on every member device) and count its gears in what the device holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from gearshift.controller.groups import Groups, lacking
from gearshift.core.config import PolicyConfig
from gearshift.core.group import decide_group, usable
from gearshift.core.memory import PriceBook
from gearshift.core.round import DeviceLedger, Round

Key = tuple[str, str]  # (group name, profile name)
MAX_LACKING = 8  # variants a rank lacks, named in the status document


class GroupRounds:
    """The group rounds of one controller over its `groups` and `devices`. `publish(device,
    now, round)` publishes a device's snapshot (the round's gears where it has them), `prices`
    gives a device's price book, `usage(device, now)` its memory usage, `memory(device)` reads
    its memory into its ledger."""

    def __init__(self, groups: Groups, devices: dict[int, DeviceLedger], policy: PolicyConfig,
                 publish: Callable[[int, float, Round | None], None],
                 prices: Callable[[int], PriceBook],
                 usage: Callable[[int, float], float | None],
                 memory: Callable[[int], float | None]) -> None:
        self.groups, self.devices, self.policy = groups, devices, policy
        self._publish, self._prices, self._usage, self._memory = publish, prices, usage, memory
        self.last_update: dict[Key, float | None] = {}
        self.degraded: dict[Key, list[int]] = {}
        self.rounds = 0  # group rounds decided
        self._next_check: dict[Key, float] = {}

    def step(self, now: float) -> None:
        """Mark, align and, when due, decide every grouped profile (module docstring)."""
        for key in list(self.groups.profiles):
            self._step(key, now)

    def _step(self, key: Key, now: float) -> None:
        group, name = key
        live = self.groups.live(key)
        devices = sorted({m.device for m in live.values()
                          if name in self.devices.get(m.device, DeviceLedger()).profiles})
        for d in devices:
            self.devices[d].profiles[name].group = group
        missing = self.groups.missing(key)
        recorder = self.groups.recorder(key)
        if missing or recorder is None or recorder.device not in devices:
            self.degraded[key] = missing
            return
        self.degraded.pop(key, None)
        self._align(name, recorder.device, devices, now)
        if now < self._next_check.get(key, -math.inf):
            return
        self._next_check[key] = now + self.policy.check_interval_seconds
        ledgers = [self.devices[d] for d in devices]
        for d in devices:
            self._memory(d)
        usages = [u for d in devices if (u := self._usage(d, now)) is not None]
        round = decide_group(name, ledgers, devices.index(recorder.device),
                             self.last_update.get(key), now, max(usages, default=None),
                             self.policy, [self._prices(d) for d in devices])
        if round is None:
            return
        self.rounds += 1
        self.last_update[key] = now
        if round.changed:
            for d in devices:
                self._publish(d, now, round)
        for ledger in ledgers:
            ledger.profiles[name].gears = round.gears[name]

    def status(self) -> list[dict[str, Any]]:
        """Per grouped profile, for the status document: its group, size, ranks (rank, slot,
        pid, device, alive), the ranks missing (no live worker), its recorder, how many
        variants are usable, and per rank that lacks some variant another rank holds, those
        variants (`lacking`: [[rank, [variant, ...]], ...], MAX_LACKING a rank)."""
        out = []
        for (group, name), members in sorted(self.groups.profiles.items()):
            key = (group, name)
            live = self.groups.live(key)
            recorder = self.groups.recorder(key)
            out.append({
                "group": group, "profile": name, "size": members.size,
                "ranks": [[r, m.slot, m.pid, m.device, r in live]
                          for r, m in sorted(members.ranks.items())],
                "missing": self.groups.missing(key),
                "recorder": next((r for r, m in live.items() if m == recorder), None),
                "usable": len(usable(members.holds, members.size)),
                "lacking": [[r, [list(v) for v in vs[:MAX_LACKING]]]
                            for r, vs in lacking(members).items()]})
        return out

    def _align(self, name: str, recorder: int, devices: list[int], now: float) -> None:
        gears = self.devices[recorder].profiles[name].gears
        for d in devices:
            p = self.devices[d].profiles[name]
            if p.gear_lists() != self.devices[recorder].profiles[name].gear_lists():
                p.gears = gears
                self._publish(d, now, None)
