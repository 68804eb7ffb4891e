"""The state file's format: what a restarted controller resumes from, written and read back.

The tree (msgpack; `snapshot` → `packed` writes it, `decode` reads it, each part's two
directions side by side below):

    {"format": 2, "boot_id": str,
     "devices": {device: {"version", "last_update", "memory_bytes",
                          "profiles": {name: {"dims", "states", "stats", "history", "costs"}}}},
     "groups": [{"group", "profile", "size", "ranks": [[rank, slot, pid, device]], "last_update"}]}

Per profile: its dims (`protocol.dim_to_dict`), each dim's gears with their creation,
protection and eviction times and the start-up ones (`states`), its decayed statistics
(`DimStats`: the window's and the history's, sparse since format 2; format 1's dense rows still
read) and the cost book's measurements (`costbook`: rows per dim). Per grouped profile (a profile
that the ranks of a tensor-parallel group declare, `controller.groups`): its group's size, each
rank's worker (slot, pid, device) and the time of its last group round.

Times are CLOCK_MONOTONIC: they are restored only when the file was written during the current
boot (same `boot_id`). After a reboot the gears come back with fresh creation times (protected
for a window) and empty statistics; versions, the device memory and measurements (they carry no
time) are kept; the groups are not restored (no rank's process outlived the boot: each group is
declared anew as its ranks register). A file from before a part existed (history, costs, device
memory, groups) restores without it.

Nothing read is trusted. Devices lie within [0, MAX_DEVICE], versions within [0, MAX_VERSION],
times are finite, a device's memory within (0, MAX_BYTES]; each profile is rebuilt through a
registration's checks (each Dim from its fields, `dims.check_profile`, every dim's gears within
its bounds) and its measurements through the workers' records' checks; anything else is a
StateError for the whole file (`decode` fills `costs` and `groups` only once all of it is read).
Statistics that do not read back sane (values outside the dim's bounds or not increasing,
weights or counts not finite and non-negative) start empty, with a warning. A group entry that
does not read back (a name, size, rank, slot, pid or device out of bounds, a rank twice, a
member device without the profile or with other dims, a profile claimed by two groups) is left
out with a warning naming the group, and the rest of the file restores: the group is then
declared anew by its ranks, as after a reboot. A restored group's members are marked on their
devices (`ProfileLedger.group`), so that no device round decides its profile before its ranks
register again; the ranks' reports of what they hold are not saved (each rank sends its own at
once when it registers again, and a stale one would make a group drop and recapture graphs its
ranks still hold).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import logging
import math
from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

from gearshift.controller.costbook import CostBook, from_state
from gearshift.controller.grouprounds import GroupRounds
from gearshift.controller.groups import Member, Members
from gearshift.core.config import MAX_BYTES, PolicyConfig
from gearshift.core.costs import Measurement
from gearshift.core.dims import Dim, brief, check_profile
from gearshift.core.gears import DimGears
from gearshift.core.group import MAX_GROUP_SIZE, Group
from gearshift.core.round import DeviceLedger, ProfileLedger
from gearshift.core.stats import DimStats, FrozenStats
from gearshift.errors import StateError
from gearshift.protocol import dim_from_dict, dim_to_dict
from gearshift.shm.control import MAX_DEVICE, MAX_SLOTS
from gearshift.shm.snapshot import MAX_VERSION

log = logging.getLogger(__name__)

STATE_FORMAT = 2  # 2: sparse statistics (`FrozenStats.to_state`); 1 still reads
MAX_PID = 1 << 22  # the kernel's largest pid_max
_PROFILE_DEPTH = 4  # in a snapshot's tree: tree -> "devices" -> device -> "profiles" -> profile
Key = tuple[str, str]  # a grouped profile: (group name, profile name)


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:  # pragma: no cover - non-Linux
        return ""


# -- the file --

def snapshot(devices: Mapping[int, DeviceLedger], costs: CostBook | None = None,
             groups: GroupRounds | None = None) -> dict[str, Any]:
    """The state file's tree as it is now: gears and members copied, statistics frozen
    (`DimStats.frozen`: references, not copies), so it costs the loop little and is packed later
    (`packed`), in any thread; later folds and rounds do not change it."""
    return {
        "format": STATE_FORMAT, "boot_id": boot_id(),
        "devices": {dev: {
            "version": d.version, "last_update": d.last_update, "memory_bytes": d.memory_bytes,
            "profiles": {name: _profile_tree(dev, name, p, costs)
                         for name, p in d.profiles.items()},
        } for dev, d in devices.items()},
        "groups": _groups_tree(groups),
    }


def decode(blob: bytes, now: float, config: PolicyConfig, costs: CostBook | None = None,
           groups: GroupRounds | None = None) -> dict[int, DeviceLedger]:
    """The devices `packed(snapshot(...))` saved, their measurements into `costs` and their
    groups into `groups` (both only once all of it is read); StateError on anything malformed
    but a group entry (left out, with a warning)."""
    measured: list[tuple[int, str, dict[str, list[Measurement]]]] = []
    try:
        data = msgpack.unpackb(blob, raw=False, strict_map_key=False)
        fmt = data["format"]
        if not isinstance(fmt, int) or fmt > STATE_FORMAT:
            raise StateError(f"state format {fmt!r} is newer than this gearshift reads "
                             f"({STATE_FORMAT})")
        same_boot = data["boot_id"] == boot_id()
        devices = {}
        for dev, d in data["devices"].items():
            profiles, costed = {}, []
            for name, p in d["profiles"].items():
                profiles[name], by_dim = _profile(name, p, now, config, same_boot)
                costed.append((name, by_dim))
            device = _bounded("device", dev, MAX_DEVICE)
            measured += [(device, name, by_dim) for name, by_dim in costed]
            last = _time(d["last_update"]) if same_boot and d["last_update"] is not None else None
            devices[device] = DeviceLedger(_bounded("version", d["version"], MAX_VERSION), last,
                                           profiles, _memory(d.get("memory_bytes")))
        entries = data.get("groups", []) if same_boot else []  # none before groups existed
    except StateError:
        raise
    except Exception as e:  # any malformed structure: one clear error, never a crash loop
        raise StateError(f"corrupt state: {type(e).__name__}: {str(e)[:200]}") from None
    restored = _groups(entries, devices)
    for (group, name), (members, _) in restored.items():
        for member in members.ranks.values():
            devices[member.device].profiles[name].group = group
    if groups is not None:
        for key, (members, last_update) in restored.items():
            groups.groups.profiles[key] = members
            if last_update is not None:
                groups.last_update[key] = last_update
    for device, name, by_dim in measured if costs is not None else ():
        for dim, ms in by_dim.items():
            for m in ms:
                costs.add(device, name, dim, m)
    return devices


def packed(tree: dict[str, Any]) -> bytes:
    """msgpack of `snapshot()`'s tree, packed one profile at a time (each piece holds the
    interpreter lock only briefly)."""
    out = io.BytesIO()
    packer = msgpack.Packer(use_bin_type=True, default=_frozen_state)

    def put(obj: Any, depth: int) -> None:
        if depth < _PROFILE_DEPTH and isinstance(obj, dict):
            out.write(packer.pack_map_header(len(obj)))
            for key, value in obj.items():
                out.write(packer.pack(key))
                put(value, depth + 1)
        else:
            out.write(packer.pack(obj))

    put(tree, 0)
    return out.getvalue()


def encode(devices: Mapping[int, DeviceLedger], costs: CostBook | None = None,
           groups: GroupRounds | None = None) -> bytes:
    """`packed(snapshot(...))`: the state file's bytes."""
    return packed(snapshot(devices, costs, groups))


def without_statistics(tree: dict[str, Any]) -> dict[str, Any]:
    """`snapshot()`'s tree with every profile's statistics emptied."""
    def emptied(p: dict[str, Any]) -> dict[str, Any]:
        return {**p, **{kind: {k: s.emptied() for k, s in p[kind].items()}
                        for kind in ("stats", "history")}}

    devices = tree["devices"]
    return {**tree, "devices": {dev: {**d, "profiles": {n: emptied(p) for n, p in
                                                        d["profiles"].items()}}
                                for dev, d in devices.items()}}


# -- a profile --

def _profile_tree(device: int, name: str, p: ProfileLedger,
                  costs: CostBook | None) -> dict[str, Any]:
    return {"dims": {k: _dim_dict(v) for k, v in p.dims.items()},
            "states": {k: _gears_tree(v) for k, v in p.gears.items()},
            "stats": {k: v.frozen() for k, v in p.stats.items()},
            "history": {k: v.frozen() for k, v in p.history.items()},
            "costs": costs.state(device, name) if costs is not None else {}}


def _profile(name: str, p: Mapping[str, Any], now: float, config: PolicyConfig,
             same_boot: bool) -> tuple[ProfileLedger, dict[str, list[Measurement]]]:
    """A profile's ledger and measurements, checked as a registration's are."""
    dims = check_profile(name, {k: dim_from_dict(v) for k, v in p["dims"].items()})
    profile = ProfileLedger.new(dims, now, config)
    if set(p["states"]) != set(dims):
        raise StateError(f"profile {name!r}: gears of {sorted(p['states'])} for "
                         f"dims {sorted(dims)}")
    for k, s in p["states"].items():
        profile.gears[k] = _dim_gears(dims[k], s, now, same_boot)
        if same_boot:
            saved = p.get("history", {})  # files before the history have none
            history = (_restore_stats(saved[k], config.history(), name, dims[k], now)
                       if k in saved else DimStats(config.history()))
            profile.stats[k] = _restore_stats(p["stats"][k], config, name, dims[k], now,
                                              history)
    return profile, from_state(name, dims, p.get("costs", {}))


@functools.lru_cache(maxsize=1024)
def _dim_dict(dim: Dim) -> dict[str, Any]:
    """`dim_to_dict`, once per distinct Dim (immutable; the dict is only read): most of a
    snapshot's time otherwise."""
    return dim_to_dict(dim)


def _gears_tree(s: DimGears) -> dict[str, Any]:
    return {"gears": list(s.gears), "created": dict(s.created),
            "protected_until": dict(s.protected_until), "evicted": dict(s.evicted),
            "initial": sorted(s.initial)}


def _dim_gears(dim: Dim, s: Mapping[str, Any], now: float, same_boot: bool) -> DimGears:
    """A dim's gears, checked as a registration's are; after a reboot created at `now`."""
    gears = _gears(dim, s["gears"])
    if not same_boot:
        return DimGears(gears, dict.fromkeys(gears, now))
    initial = frozenset(_gears(dim, s["initial"]) if s.get("initial") else ())
    return DimGears(gears, _times(s["created"]), _times(s["protected_until"]),
                    _times(s["evicted"]), initial)


def _gears(dim: Dim, gears: Any) -> tuple[int, ...]:
    """`gears` as the dim's gears, checked as a registration's are (ShapeError)."""
    checked = dataclasses.replace(dim, gears=gears).gears
    assert checked is not None
    return tuple(checked)


def _frozen_state(obj: Any) -> Any:
    if isinstance(obj, FrozenStats):
        return obj.to_state()
    raise TypeError(f"cannot save a {type(obj).__name__}")


def _restore_stats(saved: dict[str, Any], config: PolicyConfig, profile: str, dim: Dim,
                   now: float, history: DimStats | None = None) -> DimStats:
    """Saved statistics if they read back sane at `now`; else (other time settings, or
    malformed) empty ones, with a warning."""
    try:
        stats = DimStats.from_state(saved, config, history)
        view = stats.view(now)
        values = view.values
        if len(values) and (values[0] < dim.min or values[-1] > dim.max
                            or not (np.diff(values) > 0).all()):
            raise StateError("values outside the dim's bounds")
        if not (np.isfinite(view.weights).all() and (view.weights >= 0).all()
                and (view.counts >= 0).all()):
            raise StateError("weights or counts not finite and non-negative")
        return stats
    except Exception as e:  # whatever the saved arrays hold
        log.warning("statistics of %s start empty: %s: %s", profile, type(e).__name__,
                    str(e)[:200])
        return DimStats(config, history)


# -- the groups --

def _groups_tree(groups: GroupRounds | None) -> list[dict[str, Any]]:
    if groups is None:
        return []
    return [{"group": group, "profile": name, "size": m.size,
             "ranks": [[r, x.slot, x.pid, x.device] for r, x in sorted(m.ranks.items())],
             "last_update": groups.last_update.get((group, name))}
            for (group, name), m in groups.groups.profiles.items()]


def _groups(entries: Any, devices: Mapping[int, DeviceLedger]
            ) -> dict[Key, tuple[Members, float | None]]:
    """The group entries that read back, each as (members, its last round's time); the others
    left out with a warning naming the group."""
    profiles = sum(len(d.profiles) for d in devices.values())
    if not isinstance(entries, list) or len(entries) > profiles:  # a member holds a profile
        log.warning("the state file's groups are not restored (%s, with %d profiles): each is "
                    "declared anew by its ranks", brief(entries), profiles)
        return {}
    restored: dict[Key, tuple[Members, float | None]] = {}
    claimed: dict[tuple[int, str], str] = {}  # (device, profile) -> its group
    for entry in entries:
        try:
            key, members, last_update = _group(entry, devices)
            if key in restored:
                raise StateError("it is saved twice")
            for m in members.ranks.values():
                other = claimed.get((m.device, key[1]))
                if other is not None:
                    raise StateError(f"device {m.device}'s profile {key[1]!r} is of group "
                                     f"{other!r} too")
        except Exception as e:  # whatever the entry holds: this group alone is left out
            name = entry.get("group") if isinstance(entry, Mapping) else entry
            log.warning("group %s not restored: %s: %s; its ranks declare it anew",
                        brief(name), type(e).__name__, str(e)[:200])
            continue
        restored[key] = members, last_update
        claimed.update({(m.device, key[1]): key[0] for m in members.ranks.values()})
    return restored


def _group(entry: Mapping[str, Any], devices: Mapping[int, DeviceLedger]
           ) -> tuple[Key, Members, float | None]:
    """One group entry, checked: (its key, its members, its last round's time)."""
    size, name = _bounded("size", entry["size"], MAX_GROUP_SIZE), entry["profile"]
    Group(entry["group"], 0, size)  # the name and size, as a declaration's (GroupError)
    if not isinstance(name, str):
        raise StateError(f"profile {brief(name)} is not a name")
    ranks: dict[int, Member] = {}
    dims: dict[str, Dim] | None = None
    if not isinstance(entry["ranks"], list) or not 1 <= len(entry["ranks"]) <= size:
        raise StateError(f"ranks {brief(entry['ranks'])} are not 1..{size} [rank, slot, pid, "
                         "device]")
    for rank, slot, pid, device in entry["ranks"]:
        member = Member(_bounded("slot", slot, MAX_SLOTS - 1), _bounded("pid", pid, MAX_PID),
                        _bounded("device", device, MAX_DEVICE))
        if _bounded("rank", rank, size - 1) in ranks:
            raise StateError(f"rank {rank} is saved twice")
        profile = devices[device].profiles[name] if device in devices and name in devices[
            device].profiles else None
        if profile is None:
            raise StateError(f"rank {rank}'s device {device} holds no profile {name!r}")
        if dims is not None and list(profile.dims.items()) != list(dims.items()):
            raise StateError(f"rank {rank}'s device {device} holds {name!r} with other dims")
        dims, ranks[rank] = profile.dims, member
    assert dims is not None
    last = entry["last_update"]
    return ((entry["group"], name), Members(size, dict(dims), ranks),
            None if last is None else _time(last))


# -- the values --

def _memory(value: Any) -> float | None:
    """A device's memory in bytes: None (not read, or a file from before it was kept), or a
    number in (0, MAX_BYTES]."""
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not 0 < value <= MAX_BYTES):
        raise StateError(f"device memory {value!r:.60} is outside (0, {MAX_BYTES:.0f}] bytes")
    return float(value)


def _time(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise StateError(f"a time is a finite number, got {value!r:.60}")
    return float(value)


def _times(mapping: Any) -> dict[int, float]:
    if not isinstance(mapping, Mapping):
        raise StateError(f"expected gear -> time, got {type(mapping).__name__}")
    return {_bounded("gear", g, 2**63 - 1): _time(t) for g, t in mapping.items()}


def _bounded(what: str, value: Any, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
        raise StateError(f"{what} {value!r:.60} is outside [0, {high}]")
    return value
