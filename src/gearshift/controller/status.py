"""The controller's status document: what `gearshift status` and the metrics endpoint show.

The controller publishes it every status interval (and after each registration) in the
namespace's status region `/gearshift.<ns>.status`, a SnapshotRegion (seqlocked, so a reader
in another process never sees it torn). msgpack, so JSON-compatible except that it may hold
NaN-free floats only:

    {"format": 1, "namespace", "pid", "embedded", "time": controller monotonic seconds,
     "events": {"consumed", "folded", "unknown", "invalid", "misdated", "reclaimed_workers",
                "exited_workers", "errors", "corrupt_slots", "lock_busy", "lock_repairs",
                "measured"},
     "rounds": {"count", "seconds_sum", "last_seconds"},
     "final_save": None while running; at close "saved" or "failed: why",
     "unsaved_since": None, or the "time" of the first failed save since the last that
                      succeeded (`statefile.Saver.unsaved_since`: retried until one succeeds),
     "workers": [{"slot", "generation", "pid", "device", "alive", "consumed", "dropped",
                  "applied", "profiles": [[local id, name], ...]}],
     "devices": [{"device", "version", "memory_usage", "memory_bytes", "graph_bytes",
                  "last_update",
                  "lag": {"last_seconds", "count", "seconds_sum"},
                  "profiles": [{"name", "changes": [[dim, gear, action, reason], ...],
                                "dims": [{"name", "gears", "hit_rate", "avg_pad",
                                          "padding", "samples", "history_samples",
                                          "cost", "costs"}]}]}],
     "groups": [{"group", "profile", "size", "ranks": [[rank, slot, pid, device, alive], ...],
                 "missing": [rank, ...], "recorder", "usable",
                 "lacking": [[rank, [variant, ...]], ...]}]}

`hit_rate` and `avg_pad` are per gear (decayed, as the policy sees them); `padding` is the
decayed mean pad ratio of the dim's requests; `samples` the events in the window,
`history_samples` those in the plan's history (`PolicyConfig.history`); `costs` what the
workers measured of the dim's graphs (`CostBook.view`: measurements, per measured gear its
count, median and fitted replay seconds, capture seconds and graph bytes as {a, b} of
a + b·gear), None before any; a device's `memory_bytes`: its memory as its workers last read
it (`DeviceLedger.memory_bytes`, kept across restarts; None: never read), and its
`graph_bytes` {"held", "bound", "buffers"}: what its priced dims' graphs and their profiles'
static buffers hold on all its workers, its memory bound (None: none; `core.memory`), and
the buffers' part of "held" (0 where unreported);
`groups` are the groups of ranks (docs/architecture.md, "Tensor parallel";
`GroupRounds.status`, added by the controller): a group's `missing` ranks have no live worker
(the group is decided no more until they are back), its `recorder` is the rank whose
statistics it is decided on, `usable` the count of variants every rank holds, `lacking` per
rank the variants (a gear per dim) some other rank holds and it lacks (a capture that failed
there: never routed; a replaced rank until the group recaptures);
`measured` counts the measurement records kept (`unknown` and
`invalid` count the refused ones with the samples). A restarted
controller reads the last document to map the live workers' profile ids again before they
re-register (events in their rings are then folded, not counted as unknown).

A document over the region's capacity is published shrunk (`shrinking`), with `"truncated": why`
added: first without the per-gear `hit_rate`, `avg_pad` and `costs`, then without the devices'
`profiles`.

`document` builds it from plain data (ledgers, workers, counters), so this module knows
nothing of the controller itself.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from gearshift.controller.costbook import CostBook
from gearshift.controller.ingest import Batch
from gearshift.controller.slots import Lag, Slots, Worker
from gearshift.core.config import PolicyConfig
from gearshift.core.round import DeviceLedger, ProfileLedger
from gearshift.core.rules import gear_stats
from gearshift.errors import GearshiftError, LayoutError, PayloadError
from gearshift.shm import SlotInfo, SnapshotRegion, names

FORMAT = 1
CAPACITY = 1 << 20


def open_region(namespace: str) -> SnapshotRegion:
    """The namespace's status region, created if needed (the controller)."""
    return SnapshotRegion.open_named(names.status(namespace), CAPACITY)


@contextmanager
def kept_region(namespace: str) -> Iterator[SnapshotRegion | None]:
    """The namespace's status region (None if there is no readable one), kept mapped until
    the end: the mapping outlives the namespace's removal."""
    try:
        region = SnapshotRegion.attach_named(names.status(namespace))
    except (OSError, GearshiftError):
        region = None
    try:
        yield region
    finally:
        if region is not None:
            region.close()


def save_failure(region: SnapshotRegion | None, pid: int) -> str | None:
    """"failed: why" if the last document of controller `pid` in `region` says its final save
    failed; None if it was saved, or that is not known."""
    try:
        snapshot = region.read() if region is not None else None
    except PayloadError:
        return None
    doc = snapshot.payload if snapshot is not None and isinstance(snapshot.payload, dict) else {}
    outcome = doc.get("final_save") if doc.get("pid") == pid else None
    return outcome if isinstance(outcome, str) and outcome.startswith("failed") else None


def read(namespace: str) -> dict[str, Any] | None:
    """The last status document of `namespace`; None if there is no readable one."""
    try:
        region = SnapshotRegion.attach_named(names.status(namespace))
    except (FileNotFoundError, LayoutError):
        return None
    try:
        snapshot = region.read()
    except PayloadError:
        return None
    finally:
        region.close()
    doc = snapshot.payload if snapshot else None
    return doc if isinstance(doc, dict) and doc.get("format") == FORMAT else None


def profile_view(
    name: str, profile: ProfileLedger, changes: list[list[Any]], now: float, policy: PolicyConfig,
    costs: Mapping[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """One profile's entry: per dim its gears with their decayed statistics at `now`, and
    its measured `costs` (`CostBook.view`)."""
    dims = []
    for dim_name, dim in profile.dims.items():
        stats = profile.stats[dim_name]
        hist = stats.view(now)
        table = gear_stats(profile.gears[dim_name].gears, hist, dim, policy)
        dims.append(
            {
                "name": dim_name,
                "gears": [s.gear for s in table],
                "hit_rate": [s.hit_rate for s in table],
                "avg_pad": [s.avg_pad for s in table],
                "padding": sum(s.hit_rate * s.avg_pad for s in table),
                "samples": hist.total_count,
                "history_samples": (stats.history.view(now).total_count
                                    if stats.history is not None else 0),
                "cost": list(dim.cost),
                "costs": (costs or {}).get(dim_name),
            }
        )
    return {"name": name, "changes": changes, "dims": dims}


def counters(batch: Batch, costs: CostBook, slots: Slots, errors: int,
             lock_repairs: int) -> dict[str, int]:
    """The document's event counters (a new dict): the batch's, the slot table's, the loop's
    `errors` and `lock_repairs`, the cost book's measured records (its refused ones added to
    the batch's `unknown` and `invalid`)."""
    measured = costs.counts
    counts = {**batch.counts, "reclaimed_workers": slots.reclaimed, "exited_workers": slots.exited,
              "errors": errors, "corrupt_slots": len(slots.corrupt),
              "lock_busy": slots.lock_busy, "lock_repairs": lock_repairs,
              "measured": measured["measured"]}
    counts["unknown"] += measured["unknown"]  # records of either kind refused
    counts["invalid"] += measured["invalid"]
    return counts


def document(
    now: float,
    *,
    namespace: str,
    embedded: bool,
    policy: PolicyConfig,
    counts: Mapping[str, int],
    rounds: Mapping[str, Any],
    workers: Iterable[Worker],
    devices: Mapping[int, DeviceLedger],
    memory_usage: Mapping[int, float | None],
    lags: Mapping[int, Lag],
    changes: Mapping[int, Mapping[str, list[list[Any]]]],
    costs: CostBook | None = None,
    final_save: str | None = None,
    unsaved_since: float | None = None,
    graph_bytes: Mapping[int, tuple[float, float | None, float]] | None = None,
    memory_bytes: Mapping[int, float | None] | None = None,
) -> dict[str, Any]:
    """The status document at `now`: the event `counts`, decision `rounds`, the `workers`,
    and per device of `devices` its `memory_usage` and `memory_bytes`, `lags`, last round's
    `changes` and the measured `costs` of its profiles, and its `graph_bytes` (held, bound,
    buffers)."""
    worker_entries = [
        {
            "slot": w.info.slot,
            "generation": w.info.generation,
            "pid": w.info.pid,
            "device": w.info.device,
            "alive": w.info.alive,
            "consumed": w.consumed,
            "dropped": w.ring.dropped if w.ring is not None else w.info.dropped,
            "applied": w.info.applied_version,
            "profiles": [[local, name] for local, name in w.profiles.items()],
        }
        for w in workers
    ]
    device_entries = []
    for device, dev in sorted(devices.items()):
        last = changes.get(device, {})
        lag = lags.get(device)
        device_entries.append(
            {
                "device": device,
                "version": dev.version,
                "memory_usage": memory_usage.get(device),
                "memory_bytes": (memory_bytes or {}).get(device),
                "graph_bytes": dict(zip(("held", "bound", "buffers"),
                                        (graph_bytes or {}).get(device, (0.0, None, 0.0)),
                                        strict=True)),
                "last_update": dev.last_update,
                "lag": dataclasses.asdict(lag)
                if lag
                else {"last_seconds": None, "count": 0, "seconds_sum": 0.0},
                "profiles": [
                    profile_view(name, p, last.get(name, []), now, policy,
                                 costs.view(device, name) if costs is not None else None)
                    for name, p in dev.profiles.items()
                ],
            }
        )
    return {
        "format": FORMAT,
        "namespace": namespace,
        "pid": os.getpid(),
        "embedded": embedded,
        "time": now,
        "events": dict(counts),
        "rounds": dict(rounds),
        "final_save": final_save,
        "unsaved_since": unsaved_since,
        "workers": worker_entries,
        "devices": device_entries,
    }


def shrinking(doc: dict[str, Any], capacity: int) -> Iterator[dict[str, Any]]:
    """`doc`, then smaller copies of it for a region of `capacity` bytes: each dim's per-gear
    statistics and costs left out, then every device's profiles; `truncated` says what (the
    workers' entries, from which a successor maps their ids, stay whole)."""
    yield doc
    why = f"the document exceeds the status region's {capacity} bytes"
    yield {**doc, "truncated": f"per-gear statistics left out: {why}", "devices": [
        {**dev, "profiles": [
            {**p, "dims": [{**d, "hit_rate": [], "avg_pad": [], "costs": None}
                           for d in p["dims"]]}
            for p in dev["profiles"]]}
        for dev in doc["devices"]]}
    yield {**doc, "truncated": f"profiles left out: {why}",
           "devices": [{**dev, "profiles": []} for dev in doc["devices"]]}


def profile_ids(doc: Mapping[str, Any] | None, info: SlotInfo) -> list[tuple[int, str]]:
    """(local id, profile name) of each profile that document `doc` lists for this claim of
    the slot (same slot, generation and pid); none without a document."""
    return [
        (local, name)
        for entry in (doc or {}).get("workers", [])
        if (entry["slot"], entry["generation"], entry["pid"])
        == (info.slot, info.generation, info.pid)
        for local, name in entry["profiles"]
    ]
