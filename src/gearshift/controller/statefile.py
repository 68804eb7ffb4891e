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
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import msgpack

from gearshift.core.config import PolicyConfig
from gearshift.core.gears import DimGears
from gearshift.core.round import DeviceLedger, ProfileLedger
from gearshift.core.stats import DimStats
from gearshift.errors import StateError
from gearshift.protocol import dim_from_dict, dim_to_dict

log = logging.getLogger(__name__)

STATE_FORMAT = 1
STATE_FILE = "gearshift-state.msgpack"


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


def encode(devices: dict[int, DeviceLedger]) -> bytes:
    return msgpack.packb({
        "format": STATE_FORMAT, "boot_id": boot_id(),
        "devices": {dev: {
            "version": d.version, "last_update": d.last_update,
            "profiles": {name: {
                "dims": {k: dim_to_dict(v) for k, v in p.dims.items()},
                "states": {k: _dim_state_to_dict(v) for k, v in p.gears.items()},
                "stats": {k: v.to_state() for k, v in p.stats.items()},
                "history": {k: v.to_state() for k, v in p.history.items()},
            } for name, p in d.profiles.items()},
        } for dev, d in devices.items()},
    }, use_bin_type=True)


def decode(blob: bytes, now: float, config: PolicyConfig) -> dict[int, DeviceLedger]:
    """Rebuild the devices from `encode()`'s bytes; StateError on anything malformed."""
    try:
        data = msgpack.unpackb(blob, raw=False, strict_map_key=False)
        fmt = data["format"]
        if not isinstance(fmt, int) or fmt > STATE_FORMAT:
            raise StateError(f"state format {fmt!r} is newer than this gearshift reads "
                             f"({STATE_FORMAT})")
        same_boot = data["boot_id"] == boot_id()
        devices = {}
        for dev, d in data["devices"].items():
            profiles = {}
            for name, p in d["profiles"].items():
                dims = {k: dim_from_dict(v) for k, v in p["dims"].items()}
                profile = ProfileLedger.new(dims, now, config)
                for k, s in p["states"].items():
                    gears = tuple(s["gears"])
                    profile.gears[k] = (
                        DimGears(gears, s["created"], s["protected_until"], s["evicted"],
                                 frozenset(s.get("initial", ())))
                        if same_boot else DimGears(gears, dict.fromkeys(gears, now)))
                    if same_boot:
                        saved = p.get("history", {})  # files before the history have none
                        history = (_restore_stats(saved[k], config.history(), name, k)
                                   if k in saved else DimStats(config.history()))
                        profile.stats[k] = _restore_stats(p["stats"][k], config, name, k, history)
                profiles[name] = profile
            devices[int(dev)] = DeviceLedger(int(d["version"]),
                                            d["last_update"] if same_boot else None, profiles)
        return devices
    except StateError:
        raise
    except Exception as e:  # any malformed structure: one clear error, never a crash loop
        raise StateError(f"corrupt state: {type(e).__name__}: {e}") from None


def _restore_stats(saved: dict[str, Any], config: PolicyConfig, profile: str,
                   dim: str, history: DimStats | None = None) -> DimStats:
    """Saved statistics, or empty ones when the time settings changed since they were saved."""
    try:
        return DimStats.from_state(saved, config, history)
    except StateError as e:
        log.warning("statistics of %s/%s start empty: %s", profile, dim, e)
        return DimStats(config, history)


def save(directory: Path, devices: dict[int, DeviceLedger]) -> Path:
    """Write the state file atomically; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / STATE_FILE
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".state-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(encode(devices))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load(directory: Path, now: float, config: PolicyConfig) -> dict[int, DeviceLedger]:
    """The saved devices, or {} when there is no state file yet."""
    path = directory / STATE_FILE
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        return decode(blob, now, config)
    except StateError as e:
        raise StateError(f"{path}: {e}") from None


def restore(
    directory: Path, now: float, config: PolicyConfig, fresh_on_corrupt: bool
) -> dict[int, DeviceLedger]:
    """`load`; with `fresh_on_corrupt` a file that does not load (StateError) is renamed
    `<file>.corrupt`, with a warning, and the devices start empty."""
    try:
        return load(directory, now, config)
    except StateError as e:
        if not fresh_on_corrupt:
            raise
        aside = directory / (STATE_FILE + ".corrupt")
        os.replace(directory / STATE_FILE, aside)
        log.warning("%s; starting fresh (the file is kept as %s)", e, aside)
        return {}
