"""The fleet's objects as bytes: a node's generation and its pointer, msgpack, trusted in nothing.

A generation is one node's publish (`encode`): its name, the wall-clock time of the publish,
and per (device, profile) an entry: the profile's identity (`core.fleet.FleetKey.identity`),
its name and device, and per dim its gears, the window's and the history's statistics
(`core.fleet.Compact`: values, weights, counts and ages as little-endian arrays) and the
measured costs (rows [gear, capture seconds, graph bytes, replay seconds]). A pointer names
the node's newest generation and its size.

`decode` and `read_pointer` check everything as the state file's reading does: the size
(MAX_OBJECT_BYTES, MAX_POINTER_BYTES), the schema (every key, every type), and every value's
bounds (a node's name, a finite publish time no more than MAX_SKEW seconds ahead of the
reader, at most MAX_ENTRIES entries, MAX_VALUES values a dim, MAX_COSTS rows a dim, gears
within [1, 2**63 - 1], statistics as `Compact` and measurements as `Measurement` check them);
anything else is a PayloadError naming what was wrong, never the bytes.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gearshift.core.costs import Measurement
from gearshift.core.dims import MAX_DIMS, MAX_NAME, MAX_VALUE, Gears
from gearshift.core.fleet import Compact, Member
from gearshift.errors import PayloadError, ShapeError
from gearshift.shm.codec import pack, unpack

FORMAT = 1
MAX_OBJECT_BYTES = 8 << 20  # a generation
MAX_POINTER_BYTES = 1024
MAX_ENTRIES = 256  # (device, profile) entries of one node
MAX_VALUES = 1 << 16  # distinct values of one dim's statistics
MAX_COSTS = 1024  # measurement rows of one dim
MAX_GEARS = 1024  # gears of one dim
MAX_IDENTITY = 16 << 10  # characters of a profile's identity
MAX_SKEW = 300.0  # seconds a publish may be ahead of the reader's wall clock
NODE = re.compile(r"[A-Za-z0-9_.-]{1,128}\Z")
GENERATION = re.compile(r"gen-[0-9]{1,20}-[0-9a-f]{1,32}\.msgpack\Z")


@dataclass(frozen=True)
class Entry:
    """One (device, profile) of a node's generation: what merges is `member`, with those
    whose `identity` is the same."""

    identity: str
    name: str
    device: int
    member: Member


@dataclass(frozen=True)
class Generation:
    """One node's publish as read: when (`published`, its wall clock), and its entries."""

    node: str
    published: float
    entries: tuple[Entry, ...]


def check_node(node: str) -> str:
    if not isinstance(node, str) or not NODE.match(node):
        raise PayloadError(f"a node's name is 1..128 of [A-Za-z0-9_.-], got {str(node)[:60]!r}")
    return node


def _compact(c: Compact) -> dict[str, Any]:
    return {"values": c.values.astype("<i8").tobytes(), "weights": c.weights.astype("<f8")
            .tobytes(), "counts": c.counts.astype("<i8").tobytes(),
            "ages": c.ages.astype("<f8").tobytes(), "span": float(c.span)}


def encode(node: str, published: float, entries: Sequence[Entry]) -> bytes:
    """A generation's bytes (PayloadError if it would exceed MAX_OBJECT_BYTES)."""
    blob = pack({"format": FORMAT, "node": check_node(node), "published": float(published),
                 "entries": [{
                     "identity": e.identity, "name": e.name, "device": e.device,
                     "dims": {d: {"gears": list(g), "window": _compact(e.member.window[d]),
                                  "history": _compact(e.member.history[d]),
                                  "costs": [[m.gear, m.capture_seconds, m.graph_bytes,
                                             m.replay_seconds]
                                            for m in e.member.costs.get(d, ())][-MAX_COSTS:]}
                              for d, g in e.member.gears.items()}}
                     for e in entries[:MAX_ENTRIES]]})
    if len(blob) > MAX_OBJECT_BYTES:
        raise PayloadError(f"a generation of {len(blob)} bytes exceeds {MAX_OBJECT_BYTES}")
    return blob


def pointer(generation: str, size: int, published: float) -> bytes:
    return pack({"format": FORMAT, "generation": generation, "bytes": size,
                 "published": float(published)})


def read_pointer(blob: bytes, wall: float) -> tuple[str, int, float]:
    """(generation name, its size, its publish time) of a pointer's bytes."""
    data = _map(unpack(blob, MAX_POINTER_BYTES), "pointer")
    _format(data)
    name = data.get("generation")
    if not isinstance(name, str) or not GENERATION.match(name):
        raise PayloadError(f"a pointer names no generation: {str(name)[:60]!r}")
    size = _int(data.get("bytes"), "bytes", 1, MAX_OBJECT_BYTES)
    return name, size, _published(data.get("published"), wall)


def decode(blob: bytes, wall: float) -> Generation:
    """A generation read at the reader's `wall` clock (module docstring for the checks)."""
    data = _map(unpack(blob, MAX_OBJECT_BYTES), "generation")
    _format(data)
    node = check_node(data.get("node"))  # type: ignore[arg-type]
    published = _published(data.get("published"), wall)
    raw = data.get("entries")
    if not isinstance(raw, list) or len(raw) > MAX_ENTRIES:
        raise PayloadError(f"entries is not a list of at most {MAX_ENTRIES}")
    elapsed = max(wall - published, 0.0)
    try:
        entries = tuple(_entry(_map(e, "entry"), node, elapsed) for e in raw)
    except (ShapeError, TypeError, ValueError) as e:
        raise PayloadError(f"a malformed entry: {str(e)[:200]}") from None
    return Generation(node, published, entries)


def _entry(e: Mapping[str, Any], node: str, elapsed: float) -> Entry:
    identity, name = e.get("identity"), e.get("name")
    if not isinstance(identity, str) or not 0 < len(identity) <= MAX_IDENTITY:
        raise PayloadError("an entry's identity is not text of a bounded length")
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME:
        raise PayloadError("an entry's profile name is not text of a bounded length")
    device = _int(e.get("device"), "device", 0, 1 << 16)
    dims = _map(e.get("dims"), "dims")
    if not 1 <= len(dims) <= MAX_DIMS:
        raise PayloadError(f"an entry has {len(dims)} dims, not 1..{MAX_DIMS}")
    gears, window, history, costs = {}, {}, {}, {}
    for d, v in dims.items():
        if not isinstance(d, str) or not 0 < len(d) <= MAX_NAME:
            raise PayloadError("a dim's name is not text of a bounded length")
        v = _map(v, "dim")
        gears[d] = _gears(v.get("gears"))
        window[d], history[d] = _read_compact(v.get("window")), _read_compact(v.get("history"))
        costs[d] = _costs(v.get("costs"))
    return Entry(identity, name, device, Member(node, elapsed, gears, window, history, costs))


def _gears(raw: Any) -> Gears:
    if not isinstance(raw, list) or not 0 < len(raw) <= MAX_GEARS or any(
            isinstance(g, bool) or not isinstance(g, int) or not 1 <= g <= MAX_VALUE
            for g in raw):
        raise PayloadError(f"gears are not 1..{MAX_GEARS} ints in [1, 2**63 - 1]")
    if any(b <= a for a, b in itertools.pairwise(raw)):
        raise PayloadError("gears are not increasing")
    return tuple(raw)


def _read_compact(raw: Any) -> Compact:
    c = _map(raw, "statistics")
    arrays = {}
    for key, dtype in (("values", "<i8"), ("weights", "<f8"), ("counts", "<i8"),
                       ("ages", "<f8")):
        b = c.get(key)
        if not isinstance(b, bytes) or len(b) % 8 or len(b) > 8 * MAX_VALUES:
            raise PayloadError(f"statistics' {key} is not an array of at most {MAX_VALUES}")
        arrays[key] = np.frombuffer(b, dtype).astype(dtype[1:])
    span = c.get("span")
    if isinstance(span, bool) or not isinstance(span, (int, float)):
        raise PayloadError("statistics' span is not a number")
    return Compact(arrays["values"], arrays["weights"], arrays["counts"], arrays["ages"],
                   float(span))


def _costs(raw: Any) -> list[Measurement]:
    if not isinstance(raw, list) or len(raw) > MAX_COSTS:
        raise PayloadError(f"costs are not a list of at most {MAX_COSTS} rows")
    out = []
    for row in raw:
        if not isinstance(row, list) or len(row) != 4:
            raise PayloadError("a cost row is not [gear, capture s, bytes, replay s]")
        if isinstance(row[2], bool) or not isinstance(row[2], int):
            raise PayloadError("a cost row's bytes are not an int")
        out.append(Measurement(*row))
    return out


def _map(raw: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(raw, dict):
        raise PayloadError(f"the {what} is not a map")
    return raw


def _format(data: Mapping[str, Any]) -> None:
    if data.get("format") != FORMAT:
        raise PayloadError(f"format {str(data.get('format'))[:20]!r} is not {FORMAT}")


def _int(raw: Any, what: str, low: int, high: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        raise PayloadError(f"{what} is not an int in [{low}, {high}]")
    return raw


def _published(raw: Any, wall: float) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise PayloadError("the publish time is not a finite number")
    if raw > wall + MAX_SKEW:
        raise PayloadError(f"published {raw - wall:.0f} s ahead of this node's clock (over "
                           f"{MAX_SKEW:.0f} s)")
    return float(raw)
