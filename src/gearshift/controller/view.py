"""What the controller's commands read of a namespace from outside its controller: the control
segment (ControllerNotFound saying how to start a controller when there is none), the devices
that have a snapshot region, and the view `gearshift status` prints (`gather`, `render`).

The view is the slot table as it is now, then each device's snapshot version read just after
it (a worker acks only versions it has read, so no slot's applied version is ahead of its
device's there), then the controller's last status document, published every status interval,
whose versions may lag both. The text gives ratios in percent; the JSON keeps fractions.
Measured costs (a dim's `costs`) show as their fits, then per measured gear the median and
fitted replay times.
"""

from __future__ import annotations

import os
from typing import Any

from gearshift.clock import Clock
from gearshift.controller import status as status_doc
from gearshift.core.dims import Dim
from gearshift.errors import ControllerNotFound, GearshiftError
from gearshift.shm import Registry, SlotState, SnapshotRegion, names
from gearshift.shm.segment import SHM_DIR


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


def gather(namespace: str, clock: Clock) -> dict[str, Any]:
    """The status view: the slot table, then the devices' versions (read after it, so that
    none is behind a slot's applied version), then the controller's last document."""
    registry = attach(namespace)
    try:
        owner = registry.controller()
        slots = [s._asdict() for s in registry.slots() if s.state != SlotState.FREE]
    finally:
        registry.close()
    for s in slots:
        s["state"] = SlotState(s["state"]).name.lower()
    beat = clock.now() - owner.heartbeat_ns / 1e9 if owner.heartbeat_ns else None
    return {
        "namespace": namespace,
        "controller": {"pid": owner.pid, "alive": owner.alive, "heartbeat_age_seconds": beat},
        "slots": slots,
        "versions": _versions(namespace),
        "status": status_doc.read(namespace),
    }


def render(view: dict[str, Any]) -> str:
    owner, doc = view["controller"], view["status"]
    mode = " (embedded in a worker)" if doc and doc["embedded"] else ""
    head = f"namespace {view['namespace']!r}: controller pid {owner['pid']}{mode} " + (
        "running" if owner["alive"] else "NOT RUNNING"
    )
    if owner["heartbeat_age_seconds"] is not None:
        head += f", last heartbeat {owner['heartbeat_age_seconds']:.1f} s ago"
    lines = [head]
    if doc:
        e, r = doc["events"], doc["rounds"]
        lines.append(
            f"events: {e['consumed']} consumed, {e['folded']} folded, "
            f"{e.get('measured', 0)} measurements, {e['unknown']} "
            f"unknown profile, {e['invalid']} invalid; {e['reclaimed_workers']} dead "
            f"workers reclaimed; {r['count']} rounds, last "
            f"{_ms(r['last_seconds'])}; {e['errors']} loop errors"
        )
    consumed = {(w["slot"], w["generation"]): w for w in (doc or {}).get("workers", [])}
    lines.append(
        f"{'slot':>4} {'pid':>8} {'device':>6} {'state':>8} {'applied':>7} "
        f"{'consumed':>10} {'dropped':>8}  profiles"
    )
    for s in view["slots"]:
        w = consumed.get((s["slot"], s["generation"]), {})
        profiles = ", ".join(name for _, name in w.get("profiles", []))
        state = s["state"] if s["alive"] or s["state"] != "active" else "dead"
        lines.append(
            f"{s['slot']:>4} {s['pid']:>8} {s['device']:>6} {state:>8} "
            f"{s['applied_version']:>7} {w.get('consumed', '-'):>10} "
            f"{w.get('dropped', s['dropped']):>8}  {profiles}"
        )
    for dev in (doc or {}).get("devices", []):
        usage = dev["memory_usage"]
        lines.append(
            f"device {dev['device']}: version "
            f"{view['versions'].get(str(dev['device']), dev['version'])}, memory "
            + (f"{usage:.0%}" if usage is not None else "unknown")
            + f", propagation lag {_ms(dev['lag']['last_seconds'])} (last)"
        )
        for p in dev["profiles"]:
            for d in p["dims"]:
                priced = tuple(d["cost"]) != Dim.cost  # plan mode weighs padding by it
                lines.append(
                    f"  {p['name']}/{d['name']}: padding {d['padding']:.1%} over "
                    f"{d['samples']} samples in the window"
                    + (f", {d['history_samples']} in the history" if "history_samples" in d else "")
                    + (f"; cost of a chunk of size x: {_polynomial(d['cost'])}" if priced else "")
                )
                lines.append("    gear " + " ".join(f"{g:>6}" for g in d["gears"]))
                lines.append("    hit  " + " ".join(f"{h:>6.1%}" for h in d["hit_rate"]))
                lines.append("    pad  " + " ".join(f"{a:>6.1%}" for a in d["avg_pad"]))
                lines += _costs(d.get("costs"))
            for dim, gear, action, reason in p["changes"]:
                lines.append(f"  {p['name']}/{dim} last round: {action} {gear}: {reason}")
    return "\n".join(lines)


def _costs(c: dict[str, Any] | None) -> list[str]:
    """A dim's measured costs: the fits, then per measured gear its replay times."""
    if not c:
        return []
    held = c["graph_bytes"]
    lines = [
        f"    measured: {c['measurements']} graphs; graph {_bytes(held['a'])} + "
        f"{_bytes(held['b'])}·gear",
        "    at gear     " + " ".join(f"{g:>7}" for g in c["gears"]),
    ]
    for key, label in (("replay_seconds", "replay"), ("replay_fit", "replay fit"),
                       ("capture_seconds", "capture"), ("capture_fit", "capture fit")):
        if c.get(key) is not None:
            lines.append(f"    {label:<11} " + " ".join(f"{_seconds(t):>7}" for t in c[key]))
    return lines


def _seconds(t: float) -> str:
    return (f"{t * 1e6:.0f}us" if t < 1e-3 else f"{t * 1e3:.3g}ms" if t < 1 else f"{t:.3g}s")


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f} ms"


def _polynomial(coefficients: list[float]) -> str:
    """`Dim.cost` as text: 0.0002 + 2.35e-06 x + 1.15e-09 x^2."""
    terms = [
        f"{c:g}" + ("" if i == 0 else " x" if i == 1 else f" x^{i}")
        for i, c in enumerate(coefficients)
        if c
    ]
    return " + ".join(terms)
