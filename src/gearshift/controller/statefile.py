"""The controller's state file: its device ledgers (`core.round.DeviceLedger`) on disk.

The state file lets a restarted controller resume: gears, protections, decayed
statistics and snapshot versions. It is msgpack, written atomically (temp file
in the same directory, fsync, rename), so a reader sees the old or the new file,
never a mix. Times are CLOCK_MONOTONIC: they are restored only when the file was
written during the current boot (same `boot_id`); after a reboot the gears come
back with fresh creation times (so they are protected for a window) and empty
statistics, and versions still continue. A file written before the plan's history existed
restores with an empty history. `restore` is the controller's start: a corrupt or
newer-format file is an error, or is set aside as `<file>.corrupt` when asked to start fresh.

Nothing in the file is trusted: it is restored through the checks of a registration (each Dim
rebuilt from its fields, `dims.check_profile`, every dim's gears within its bounds), devices
within [0, MAX_DEVICE], versions within [0, MAX_VERSION], times finite, a device's memory
(the bound's share floor, kept across a reboot) within (0, MAX_BYTES]; anything else is a
StateError. Statistics that do not read back sane (values outside the dim's bounds, weights not
finite) start empty, with a warning. A profile's `costs`, the cost book's measurements
(`costbook`: rows per dim), are checked as the workers' records are (a row that is not is a
StateError); they carry no time, so they survive a reboot, and a file without them restores
with none. Statistics are saved sparse (format 2: per slice only the values it saw), so the
file grows with the (slice, value) entries held, not with slices x the dims' range; a format-1
file (dense arrays) still reads. A state over what a state file may hold (MAX_STATE_BYTES) is
saved without its statistics, with a warning: gears, versions and costs are kept, the
statistics restart empty as after a reboot.

One controller process at a time: `StateLock` holds an exclusive POSIX lock on
`<state_dir>/gearshift-state.lock` for the controller's life (NamespaceBusy naming the holder's
pid otherwise; the kernel drops it when the process dies; a process may take it again, as it
may take its own namespace over), and removes temp files a killed writer left. A save fsyncs
the file, renames it over the old one and fsyncs the directory, so the rename survives a crash
too. The directory and every file in it are opened through `statedir`'s checks (ours alone, no
symlink, a bounded regular file): a FIFO, a symlink or an oversized file in place of the state
file is a StateError, a directory or file others may write is UnsafeStateDir.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import functools
import io
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from gearshift.controller import statedir
from gearshift.controller.costbook import CostBook, from_state
from gearshift.core.config import MAX_BYTES, PolicyConfig
from gearshift.core.costs import Measurement
from gearshift.core.dims import Dim, check_profile
from gearshift.core.gears import DimGears
from gearshift.core.round import DeviceLedger, ProfileLedger
from gearshift.core.stats import DimStats, FrozenStats
from gearshift.errors import NamespaceBusy, StateError
from gearshift.protocol import dim_from_dict, dim_to_dict
from gearshift.shm.control import MAX_DEVICE
from gearshift.shm.snapshot import MAX_VERSION

log = logging.getLogger(__name__)

STATE_FORMAT = 2  # 2: sparse statistics (`FrozenStats.to_state`); 1 still reads
STATE_FILE = "gearshift-state.msgpack"
LOCK_FILE = "gearshift-state.lock"
TEMP_PREFIX = ".state-"
_PROFILE_DEPTH = 4  # in a snapshot's tree: tree -> "devices" -> device -> "profiles" -> profile


def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:  # pragma: no cover - non-Linux
        return ""


def _dim_state_to_dict(s: DimGears) -> dict[str, Any]:
    return {"gears": list(s.gears), "created": dict(s.created),
            "protected_until": dict(s.protected_until), "evicted": dict(s.evicted),
            "initial": sorted(s.initial)}


def encode(devices: dict[int, DeviceLedger], costs: CostBook | None = None) -> bytes:
    return _encoded(snapshot(devices, costs))


def snapshot(devices: dict[int, DeviceLedger], costs: CostBook | None = None) -> dict[str, Any]:
    """The state file's tree as it is now: gears copied, statistics frozen (`DimStats.frozen`:
    references, not copies), so it costs the loop little and is encoded later (`write`), in any
    thread; later folds and rounds do not change it."""
    return {
        "format": STATE_FORMAT, "boot_id": boot_id(),
        "devices": {dev: {
            "version": d.version, "last_update": d.last_update, "memory_bytes": d.memory_bytes,
            "profiles": {name: {
                "dims": {k: _dim_dict(v) for k, v in p.dims.items()},
                "states": {k: _dim_state_to_dict(v) for k, v in p.gears.items()},
                "stats": {k: v.frozen() for k, v in p.stats.items()},
                "history": {k: v.frozen() for k, v in p.history.items()},
                "costs": costs.state(dev, name) if costs is not None else {},
            } for name, p in d.profiles.items()},
        } for dev, d in devices.items()},
    }


def _without_statistics(tree: dict[str, Any]) -> dict[str, Any]:
    """`snapshot()`'s tree with every profile's statistics emptied."""
    def emptied(p: dict[str, Any]) -> dict[str, Any]:
        return {**p, **{kind: {k: s.emptied() for k, s in p[kind].items()}
                        for kind in ("stats", "history")}}

    devices = tree["devices"]
    return {**tree, "devices": {dev: {**d, "profiles": {n: emptied(p) for n, p in
                                                        d["profiles"].items()}}
                                for dev, d in devices.items()}}


@functools.lru_cache(maxsize=1024)
def _dim_dict(dim: Dim) -> dict[str, Any]:
    """`dim_to_dict`, once per distinct Dim (immutable; the dict is only read): most of a
    snapshot's time otherwise."""
    return dim_to_dict(dim)


def _encoded(tree: dict[str, Any]) -> bytes:
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


def _frozen_state(obj: Any) -> Any:
    if isinstance(obj, FrozenStats):
        return obj.to_state()
    raise TypeError(f"cannot save a {type(obj).__name__}")


def decode(blob: bytes, now: float, config: PolicyConfig,
           costs: CostBook | None = None) -> dict[int, DeviceLedger]:
    """Rebuild the devices from `encode()`'s bytes, and their measurements into `costs` (only
    once all of it is read); StateError on anything malformed."""
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
                dims = check_profile(name, {k: dim_from_dict(v) for k, v in p["dims"].items()})
                profile = ProfileLedger.new(dims, now, config)
                if set(p["states"]) != set(dims):
                    raise StateError(f"profile {name!r}: gears of {sorted(p['states'])} for "
                                     f"dims {sorted(dims)}")
                for k, s in p["states"].items():
                    gears = _gears(dims[k], s["gears"])
                    profile.gears[k] = (
                        DimGears(gears, _times(s["created"]), _times(s["protected_until"]),
                                 _times(s["evicted"]), frozenset(_gears(dims[k], s["initial"])
                                                                 if s.get("initial") else ()))
                        if same_boot else DimGears(gears, dict.fromkeys(gears, now)))
                    if same_boot:
                        saved = p.get("history", {})  # files before the history have none
                        history = (_restore_stats(saved[k], config.history(), name, dims[k], now)
                                   if k in saved else DimStats(config.history()))
                        profile.stats[k] = _restore_stats(p["stats"][k], config, name, dims[k],
                                                          now, history)
                profiles[name] = profile
                costed.append((name, from_state(name, dims, p.get("costs", {}))))
            device, version = _bounded("device", dev, MAX_DEVICE), d["version"]
            measured += [(device, name, by_dim) for name, by_dim in costed]
            last = _time(d["last_update"]) if same_boot and d["last_update"] is not None else None
            devices[device] = DeviceLedger(_bounded("version", version, MAX_VERSION), last,
                                           profiles, _memory(d.get("memory_bytes")))
    except StateError:
        raise
    except Exception as e:  # any malformed structure: one clear error, never a crash loop
        raise StateError(f"corrupt state: {type(e).__name__}: {str(e)[:200]}") from None
    for device, name, by_dim in measured if costs is not None else ():
        for dim, ms in by_dim.items():
            for m in ms:
                costs.add(device, name, dim, m)
    return devices


def _memory(value: Any) -> float | None:
    """A device's memory in bytes: None (not read, or a file from before it was kept), or a
    number in (0, MAX_BYTES]."""
    if value is None:
        return None
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not 0 < value <= MAX_BYTES):
        raise StateError(f"device memory {value!r:.60} is outside (0, {MAX_BYTES:.0f}] bytes")
    return float(value)


def _gears(dim: Dim, gears: Any) -> tuple[int, ...]:
    """`gears` as the dim's gears, checked as a registration's are (ShapeError)."""
    checked = dataclasses.replace(dim, gears=gears).gears
    assert checked is not None
    return tuple(checked)


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


def save(directory: Path, devices: dict[int, DeviceLedger],
         costs: CostBook | None = None) -> Path:
    """Write the state file (and `costs`' measurements) atomically; returns its path."""
    return write(directory, snapshot(devices, costs))


def write(directory: Path, tree: dict[str, Any]) -> Path:
    """Encode a `snapshot()` and write it atomically (`statedir.write_atomic`), both in the
    caller's thread; returns the file's path."""
    blob = _encoded(tree)
    if len(blob) > statedir.MAX_STATE_BYTES:  # gears, versions and costs outlive statistics
        log.warning("the state is %d bytes, over the %d a state file may hold: saved without "
                    "its statistics (they restart empty, as after a reboot)", len(blob),
                    statedir.MAX_STATE_BYTES)
        blob = _encoded(_without_statistics(tree))
    with statedir.opened(directory) as dfd:
        statedir.write_atomic(directory, dfd, STATE_FILE, blob, TEMP_PREFIX)
    return directory / STATE_FILE


class StateLock:
    """The exclusive lock of a state directory, held from `acquire` to `release` (the kernel
    releases it when the process dies); see the module docstring."""

    def __init__(self, directory: Path, fd: int) -> None:
        self.directory, self._fd = directory, fd

    @classmethod
    def acquire(cls, directory: Path) -> StateLock:
        """Lock `directory` (created if needed) and remove stale temp files; NamespaceBusy
        naming the pid of another controller holding it."""
        with statedir.opened(directory) as dfd:
            fd = statedir.open_lock(directory, dfd, LOCK_FILE)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                if e.errno not in (errno.EACCES, errno.EAGAIN):
                    raise
                raise NamespaceBusy(
                    f"state directory {directory} is in use by another controller, pid {holder}"
                ) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            statedir.remove(dfd, TEMP_PREFIX)  # a writer killed before its rename
        return cls(directory, fd)

    def release(self) -> None:
        """Unlock (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def load(directory: Path, now: float, config: PolicyConfig,
         costs: CostBook | None = None) -> dict[int, DeviceLedger]:
    """The saved devices (their measurements into `costs`), or {} when there is no state
    file yet."""
    path = directory / STATE_FILE
    with statedir.opened(directory) as dfd:
        blob = statedir.read(directory, dfd, STATE_FILE)
    if blob is None:
        return {}
    try:
        return decode(blob, now, config, costs)
    except StateError as e:
        raise StateError(f"{path}: {e}") from None


def restore(
    directory: Path, now: float, config: PolicyConfig, fresh_on_corrupt: bool,
    costs: CostBook | None = None,
) -> dict[int, DeviceLedger]:
    """`load`; with `fresh_on_corrupt` a file that does not load (StateError) is renamed
    `<file>.corrupt`, with a warning, and the devices (and `costs`) start empty."""
    try:
        return load(directory, now, config, costs)
    except StateError as e:
        if not fresh_on_corrupt:
            raise
        aside = directory / (STATE_FILE + ".corrupt")
        with statedir.opened(directory) as dfd:
            statedir.set_aside(dfd, STATE_FILE, aside.name)
        log.warning("%s; starting fresh (the file is kept as %s)", e, aside)
        return {}
