"""What the controller's commands read of a namespace from outside its controller: the control
segment (ControllerNotFound saying how to start a controller when there is none), the devices
that have a snapshot region and their latest snapshots (`snapshots`, with `staleness`: the age
of gears a stopped controller left), and the view `gearshift status` prints (`gather`,
`render`).

The view is the slot table as it is now, then each device's snapshot version read just after
it (a worker acks only versions it has read, so no slot's applied version is ahead of its
device's there), then the controller's last status document, published every status interval,
whose versions may lag both. A controller that is gone shows its last pid (the slot table's
owner, else the document's). The text gives ratios in percent; the JSON keeps fractions. It
fits `width` columns (80 by default): gear lists and reasons wrap, per-gear tables come in
blocks of as many gears as fit. `verbose` adds the per-gear hit and pad rates and the
measured costs (a dim's `costs`: their fits, then per measured gear the median and fitted
replay and capture times).
"""

from __future__ import annotations

import os
import textwrap
from typing import Any

from gearshift.clock import Clock
from gearshift.controller import status as status_doc
from gearshift.core.config import MAX_BYTES
from gearshift.core.dims import Dim
from gearshift.errors import ControllerNotFound, GearshiftError
from gearshift.shm import Registry, SlotState, Snapshot, SnapshotRegion, names
from gearshift.shm.segment import SHM_DIR

NB = "\xa0"  # a space the text wraps at no line's end


def not_running(namespace: str) -> ControllerNotFound:
    return ControllerNotFound(
        f"no controller is running on namespace {namespace!r} "
        f"(start one with `gearshift serve -n {namespace}`)"
    )


def attach(namespace: str) -> Registry:
    """The namespace's control segment; ControllerNotFound saying how to start a controller."""
    try:
        return Registry.attach(namespace)
    except ControllerNotFound:
        raise not_running(namespace) from None


def devices(namespace: str) -> list[int]:
    """The devices of `namespace` with a snapshot region."""
    pattern = names.segment_pattern(namespace)
    found = (pattern.fullmatch(entry) for entry in os.listdir(SHM_DIR))
    return sorted(int(m[1][5:]) for m in found if m and m[1].startswith("snap."))


def none_running(namespace: str) -> ControllerNotFound:
    """No controller to act on (`stop`): no advice to start one."""
    return ControllerNotFound(f"no controller is running on namespace {namespace!r}")


def staleness(namespace: str, clock: Clock) -> str | None:
    """A note when no live controller keeps the namespace's snapshots current: how long ago its
    last controller ran (its heartbeat, bounded: shared memory is not trusted)."""
    try:
        registry = Registry.attach(namespace)
    except (GearshiftError, OSError):
        info = None
    else:
        try:
            info = registry.controller()
        finally:
            registry.close()
    if info is not None and info.alive:
        return None
    note = f"no controller is running on namespace {namespace!r}: these are the gears it left"
    age = clock.now() - info.heartbeat_ns / 1e9 if info is not None else -1.0
    if info is None or info.heartbeat_ns <= 0 or not 0 <= age < 1e9:
        return note + ", of unknown age"
    return note + f" {_duration(age)} ago, and may be stale"


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def profile_names(payload: object) -> list[str]:
    """The profile names of a snapshot payload (which is not trusted)."""
    profiles = payload.get("profiles") if isinstance(payload, dict) else None
    return [n for n in profiles if isinstance(n, str)] if isinstance(profiles, dict) else []


def snapshots(namespace: str, device: int | None) -> dict[int, Snapshot]:
    """The latest snapshot of every device of `namespace` (or of `device` only)."""
    found = devices(namespace)
    out = {}
    for d in found if device is None else [d for d in found if d == device]:
        region = SnapshotRegion.attach(namespace, d)
        try:
            snap = region.read()
        finally:
            region.close()
        if snap is not None:
            out[d] = snap
    if not out:
        raise ControllerNotFound(
            f"namespace {namespace!r} has no published snapshot"
            + (f" of device {device}" if device is not None else "")
            + " (a device's first is published when a worker registers a profile on it)"
        )
    return out


def _versions(namespace: str) -> dict[str, int]:
    """Each device's snapshot version now (a worker acks only versions it has read there)."""
    out = {}
    for device in devices(namespace):
        try:
            region = SnapshotRegion.attach(namespace, device)
        except (FileNotFoundError, GearshiftError):  # removed meanwhile, or not ours to read
            continue
        try:
            out[str(device)] = region.version()
        finally:
            region.close()
    return out


MAX_BEAT_AGE = 86400.0 * 365  # seconds: an age beyond it (or below 0) is another clock
BEAT_LOOK = 0.2  # seconds: a controller of another pid namespace beats within it (20 loops)


def gather(namespace: str, clock: Clock) -> dict[str, Any]:
    """The status view: the slot table, then the devices' versions (read after it, so that
    none is behind a slot's applied version), then the controller's last document."""
    registry = attach(namespace)
    try:
        owner = registry.controller()
        if owner.foreign and owner.alive:  # of another pid namespace: does its lease move?
            beats = registry.controller_beats()
            clock.sleep(BEAT_LOOK)
            owner = owner._replace(alive=registry.controller_beats() != beats)
        slots = [s._asdict() for s in registry.slots() if s.state != SlotState.FREE]
    finally:
        registry.close()
    for s in slots:
        s["state"] = SlotState(s["state"]).name.lower()
    beat = clock.now() - owner.heartbeat_ns / 1e9 if owner.heartbeat_ns else None
    if beat is not None and not 0 <= beat < MAX_BEAT_AGE:  # its clock is not ours
        beat = None  # (a time namespace: CRIU, a sandbox); its lease says it lives
    versions = _versions(namespace)
    doc = status_doc.read(namespace)
    last = owner.pid or (doc["pid"] if doc and isinstance(doc.get("pid"), int) else 0)
    return {
        "namespace": namespace,
        "controller": {"pid": owner.pid, "last_pid": last, "alive": owner.alive,
                       "heartbeat_age_seconds": beat, "foreign": owner.foreign},
        "slots": slots,
        "versions": versions,
        "status": doc,
    }


def absent(namespace: str) -> str:
    """What `status --watch` shows while the namespace does not exist."""
    return "\n".join(_wrap(f"namespace {namespace!r}: no controller running (the namespace "
                           f"does not exist); waiting for `gearshift serve -n {namespace}`",
                           80, "  "))


def _misdated(events: dict[str, Any]) -> str:
    """" (N misdated)" where samples were dated outside the sane window (ingest.py)."""
    return f" ({events['misdated']} misdated)" if events.get("misdated") else ""


def render(view: dict[str, Any], *, verbose: bool = False, width: int = 80) -> str:
    owner, doc = view["controller"], view["status"]
    mode = " (embedded in a worker)" if doc and doc["embedded"] else ""
    last = owner.get("last_pid", owner["pid"])
    if owner["alive"]:
        head = f"namespace {view['namespace']!r}: controller pid {owner['pid']}{mode} running"
    else:
        embedded = ", embedded in a worker" if mode else ""
        head = f"namespace {view['namespace']!r}: controller NOT RUNNING" + (
            f" (last pid {last}{embedded})" if last else "")
    if owner.get("foreign") and owner["alive"]:
        head += " in another pid namespace (alive by its lease)"
    if owner["heartbeat_age_seconds"] is not None:
        head += f", last heartbeat {owner['heartbeat_age_seconds']:.1f}{NB}s ago"
    lines = _wrap(head, width, "  ")
    if doc and isinstance(doc.get("unsaved_since"), (int, float)) and isinstance(
            doc.get("time"), (int, float)):
        lines += _wrap(
            f"STATE UNSAVED since {doc['time'] - doc['unsaved_since']:.1f}{NB}s: its saves "
            "fail (the controller's log says why) and are retried; a crash now loses what "
            "changed since", width, "  ")
    if doc:
        e, r = doc["events"], doc["rounds"]
        lines += _wrap(
            f"events: {e['consumed']} consumed, {e['folded']} folded, "
            f"{e.get('measured', 0)} measurements, {e['unknown']} "
            f"unknown profile, {e['invalid']} invalid{_misdated(e)}; "
            f"{e.get('exited_workers', 0)} workers exited, {e['reclaimed_workers']} died; "
            f"{r['count']} rounds, last {_ms(r['last_seconds'])}; {e['errors']} loop errors",
            width, "  ")
        if doc.get("truncated"):
            lines += _wrap(f"status truncated: {doc['truncated']}", width, "  ")
        if doc.get("fleet"):
            lines += _wrap(_fleet(doc["fleet"]), width, "  ")
    consumed = {(w["slot"], w["generation"]): w for w in (doc or {}).get("workers", [])}
    lines.append(
        f"{'slot':>4} {'pid':>8} {'device':>6} {'state':>8} {'applied':>7} "
        f"{'consumed':>10} {'dropped':>8}  profiles"
    )
    for s in view["slots"]:
        w = consumed.get((s["slot"], s["generation"]), {})
        state = s["state"] if s["alive"] or s["state"] != "active" else "dead"
        row = (f"{s['slot']:>4} {s['pid']:>8} {s['device']:>6} {state:>8} "
               f"{s['applied_version']:>7} {w.get('consumed', '-'):>10} "
               f"{w.get('dropped', s['dropped']):>8}  ")
        names = [name for _, name in w.get("profiles", [])]
        if verbose:  # every name, wrapped under the column
            lines += textwrap.wrap(", ".join(names), width, initial_indent=row,
                                   subsequent_indent=" " * len(row)) or [row]
        else:
            lines.append(row + _fit(names, width - len(row)))
    for dev in (doc or {}).get("devices", []):
        usage = dev["memory_usage"]
        lines += _wrap(
            f"device {dev['device']}: version "
            f"{view['versions'].get(str(dev['device']), dev['version'])}, memory "
            + (f"{usage:.0%}" if usage is not None else "unknown") + _of(dev.get("memory_bytes"))
            + _graphs(dev.get("graph_bytes"))
            + f", propagation lag {_ms(dev['lag']['last_seconds'])} (last)", width, "  ")
        for p in dev["profiles"]:
            for d in p["dims"]:
                lines += _dim(p["name"], d, verbose, width)
            for dim, gear, action, reason in p["changes"]:
                lines += _wrap(f"  {p['name']}/{dim} last round: {action} {gear}: {reason}",
                               width, "      ")
    groups = (doc or {}).get("groups")
    for g in groups if isinstance(groups, list) else []:
        line = _group(g)
        if line is not None:
            lines += _wrap(line, width, "  ")
    return "\n".join(lines)


def _group(g: object) -> str | None:
    """One grouped profile of the status document's `groups` in one line: its name, size, the
    ranks present (a live worker), those missing, its recorder, its usable count and the
    variants a rank lacks that another holds (never routed: a failed capture); None
    when the entry is malformed (the document is read from shared memory)."""
    try:
        ranks = sorted(int(r[0]) for r in g["ranks"] if r[4] is True)
        missing = sorted(int(r) for r in g["missing"])
        name, profile = str(g["group"])[:64], str(g["profile"])[:64]
        size, usable = int(g["size"]), int(g["usable"])
        recorder = g["recorder"]
        lacks = [f"rank {int(r)} lacks {', '.join('x'.join(str(int(x)) for x in v) for v in vs)}"
                 for r, vs in g.get("lacking") or ()]
    except (AttributeError, KeyError, TypeError, ValueError, IndexError):
        return None
    present = ", ".join(map(str, ranks)) or "none"
    lost = (f"; MISSING rank{'s' if len(missing) > 1 else ''} "
            f"{', '.join(map(str, missing))} (decided no more)" if missing else "")
    who = f"rank {recorder}" if isinstance(recorder, int) else "none"
    return (f"group {name!r} (profile {profile}): {size} ranks, present {present}{lost}; "
            f"recorder {who}; {usable} usable" + "".join(f"; {x}" for x in lacks[:8]))


def _fleet(f: dict[str, Any]) -> str:
    """The status document's `fleet` in one line: the store, the state (and why alone)."""
    ago = {k: "never" if f.get(f"{k}_ago") is None else f"{f[f'{k}_ago']:.0f}{NB}s ago"
           for k in ("published", "read")}
    why = f" ({f['reason']})" if f.get("reason") else ""
    state = "ALONE" if f["state"] == "alone" else f["state"]
    return (f"fleet {f['url']} as {f['node']}: {state}{why}; {f['nodes']} other nodes, "
            f"{f['expired']} expired, {f['bad_objects']} bad "
            f"objects; published {ago['published']}, read {ago['read']}")


def _dim(profile: str, d: dict[str, Any], verbose: bool, width: int) -> list[str]:
    """One dim: its padding and samples, then its gears (verbose: with their hit and pad
    rates, and the measured costs)."""
    priced = tuple(d["cost"]) != Dim.cost  # plan mode weighs padding by it
    lines = _wrap(
        f"  {profile}/{d['name']}: padding {d['padding']:.1%} over "
        f"{d['samples']} samples in the window"
        + (f", {d['history_samples']} in the history" if "history_samples" in d else ""),
        width, "      ")
    if priced:
        lines += _wrap(f"    cost of a chunk of size x: {_polynomial(d['cost'])}", width,
                       "      ")
    if not verbose:
        return lines + _wrap("    gears " + " ".join(str(g) for g in d["gears"]), width,
                             "          ")
    lines += _table("    ", 5, 6, width, [
        ("gear", [str(g) for g in d["gears"]]),
        ("hit", [f"{h:.1%}" for h in d["hit_rate"]]),
        ("pad", [f"{a:.1%}" for a in d["avg_pad"]])])
    return lines + _costs(d.get("costs"), width)


def _costs(c: dict[str, Any] | None, width: int = 80) -> list[str]:
    """A dim's measured costs: the fits, then per measured gear its replay times."""
    if not c:
        return []
    held = c["graph_bytes"]
    rows = [("at gear", [str(g) for g in c["gears"]])]
    for key, label in (("replay_seconds", "replay"), ("replay_fit", "replay fit"),
                       ("capture_seconds", "capture"), ("capture_fit", "capture fit")):
        if c.get(key) is not None:
            rows.append((label, [_seconds(t) for t in c[key]]))
    return [f"    measured: {c['measurements']} graphs; graph {_bytes(held['a'])} + "
            f"{_bytes(held['b'])}·gear", *_table("    ", 11, 7, width, rows)]


def _table(indent: str, label: int, cell: int, width: int,
           rows: list[tuple[str, list[str]]]) -> list[str]:
    """Rows of cells under one another, in blocks of as many columns as fit `width`."""
    per = max(1, (width - len(indent) - label) // (cell + 1))
    n = max((len(cells) for _, cells in rows), default=0)
    lines = []
    for i in range(0, n, per):
        lines += [f"{indent}{name:<{label}}" + "".join(f" {c:>{cell}}" for c in cells[i:i + per])
                  for name, cells in rows]
    return lines


def _wrap(text: str, width: int, indent: str) -> list[str]:
    """`text` in lines of `width`, never broken inside a figure and its unit (joined by NB)."""
    lines = textwrap.wrap(text, width, subsequent_indent=indent, break_long_words=False,
                          break_on_hyphens=False) or [text]
    return [line.replace(NB, " ") for line in lines]


def _fit(names: list[str], room: int) -> str:
    """Profile names joined, cut to `room` characters with the count of those left out."""
    text = ", ".join(names)
    if len(text) <= room:
        return text
    for k in range(len(names) - 1, 0, -1):
        shown = ", ".join(names[:k]) + f", +{len(names) - k} more"
        if len(shown) <= room:
            return shown
    return f"{len(names)} profiles"


def _of(total: object) -> str:
    """The device's memory after its usage (" of 80 GiB"), where the document has one within
    (0, MAX_BYTES], the bound the controller reads it under (an older controller's has none)."""
    ok = isinstance(total, (int, float)) and not isinstance(total, bool) and 0 < total <= MAX_BYTES
    return f" of{NB}{_bytes(float(total))}" if ok else ""


def _graphs(held: dict[str, Any] | None) -> str:
    """The device's priced graphs (with their buffers, where reported) against its bound, or
    nothing before any is priced."""
    if not held or (not held.get("held") and held.get("bound") is None):
        return ""
    bound = "no bound" if held["bound"] is None else f"bound {_bytes(held['bound'])}"
    buffers = held.get("buffers") or 0.0  # absent from an older controller's document
    with_buffers = f" with buffers{NB}{_bytes(buffers)}" if buffers > 0 else ""
    return f", graphs{NB}{_bytes(held['held'])}{with_buffers} ({bound})"


def _seconds(t: float) -> str:
    return (f"{t * 1e6:.0f}us" if t < 1e-3 else f"{t * 1e3:.3g}ms" if t < 1 else f"{t:.3g}s")


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}{NB}ms"


def _polynomial(coefficients: list[float]) -> str:
    """`Dim.cost` as text: 0.0002 + 2.35e-06 x + 1.15e-09 x^2."""
    terms = [
        f"{c:g}" + ("" if i == 0 else " x" if i == 1 else f" x^{i}")
        for i, c in enumerate(coefficients)
        if c
    ]
    return " + ".join(terms)
