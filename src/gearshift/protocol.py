"""Messages between workers and the controller, above the shared-memory primitives.

Registration (worker -> controller, the slot's request mailbox), once per profile:

    {"op": "register", "profile": P, "name": NAME, "dims": [[DIM, {Dim fields}], ...]}

`P` is the worker-local profile id (0..65535) that the worker's ring records carry; dims
are in the order of the records' `values`. The controller rebuilds every Dim from its fields
and checks the profile with `dims.check_profile`: the client's own rule, so whatever one
accepts the other does. Refusals name the field and never quote more than a few dozen
characters of what was sent. The controller answers in the reply mailbox with
`{"op": "registered", "profile": P, "version": V}` (V: the device's snapshot version now) or
`mailbox.error_reply(ProfileMismatch(...))` when NAME is registered on the same device with
other dims. A worker re-registers its profiles when the controller's identity changes.

A rank of a group (docs/architecture.md, "Tensor parallel") adds `"group": [GROUP, RANK,
SIZE]` to its registration (`core.group.Group`; absent for a profile of no group), and the
controller's reply echoes the group's name (`"group": GROUP`): a reply without it comes from a
controller that predates groups, and the worker refuses the profile rather than serve it
ungrouped. The mailbox carries msgpack maps, so neither key changes a shared-memory layout.

What a rank holds (worker -> controller, the slot's request mailbox; no reply), after each
change of the graphs it has captured of a grouped profile: `{"op": "holds", "profile": P,
"variants": [[g, ...], ...], "epoch": E, "count": C}`, every variant (a gear per dim, in record
order) it holds, at most MAX_HELD, and the rank's epoch (that of the last reset maintenance it
ran, 0 before any) and count of maintenances since (`worker.group.Maintenance`), each in [0,
MAX_MARK]; a report without them (an older worker) reads as epoch 0, count 0, which no driver's
epoch matches. The controller keeps each rank's last report; a rank's restarted process holds
nothing until it reports.

Snapshot payload (controller -> every worker of one device, its snapshot region):

    {"device": D, "profiles": {NAME: {"gears": {DIM: [g, ...]}, "changes": [[DIM, gear,
     action, reason], ...]}}}

`changes` are the last round's decisions of that profile (for status views). The payload
carries no version: the region's seqlock version is the snapshot version. A grouped profile's
entry adds `"group": {"name": GROUP, "size": N, "usable": [[g, ...], ...], "reported": B,
"replaced": R, "at": [E, C] or null}`: the variants every rank of the group holds
(`core.group.usable`), the epoch of every rank's last report and the least count among them
(`core.group.usable_at`; null when the epochs differ or a rank has not reported), whether
every rank has reported (a usable set that lost what the driver holds, with every report in: a
rank lacks it), and how many times a rank was declared by another worker than the one that
held it (it grows when a rank's process is replaced: the driver resets the group).

Ring records: `Kind.SHAPE` / `Kind.EAGER` / `Kind.RECORDED` (`record()`: only recorded) with
`profile` = P, `values` = raw sizes in dim
order, `version` = the snapshot version the request was routed with; `Kind.MEMORY` readings
about once a second; `Kind.MEASURED`, one per dim of each graph captured (`ring.measured`:
gear, capture ns, graph bytes, replay ns; chunks = the dim's index), once P is registered;
`Kind.BUFFERS`, one per dim of P's static buffers when they change and every few seconds
(`ring.buffers`: the dim's gear they are sized at, their bytes, the bytes on the dim, 0).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gearshift.core.dims import Dim, Gears, brief, check_profile
from gearshift.core.group import Group
from gearshift.errors import GroupError, PayloadError, ShapeError

MAX_PROFILE_ID = 0xFFFF
MAX_HELD = 512  # variants one report of what a rank holds may name (fits a default mailbox)
MAX_MARK = 2**63 - 1  # the largest epoch or count a report or a maintenance may carry
_DIM_FIELDS = {f.name for f in dataclasses.fields(Dim)}


def dim_to_dict(dim: Dim) -> dict[str, Any]:
    out = dataclasses.asdict(dim)
    out["gears"] = list(dim.gears) if dim.gears is not None else None
    return out


def dim_from_dict(data: Mapping[str, Any]) -> Dim:
    """A Dim from `dim_to_dict`'s output; ShapeError on unknown fields or invalid values."""
    if not isinstance(data, Mapping):
        raise ShapeError(f"a Dim is a map of its fields, got {brief(data)}")
    unknown = set(map(str, data)) - _DIM_FIELDS
    if unknown:
        raise ShapeError(f"unknown Dim fields: {brief(sorted(unknown))}")
    try:
        return Dim(**data)
    except TypeError as e:
        raise ShapeError(f"invalid Dim: {str(e)[:100]}") from None


def register_message(profile: int, name: str, dims: Mapping[str, Dim],
                     group: Group | None = None) -> dict[str, Any]:
    """The registration of profile `name` (worker-local id `profile`), of `group` if given."""
    msg = {"op": "register", "profile": profile, "name": name,
           "dims": [[k, dim_to_dict(v)] for k, v in dims.items()]}
    if group is not None:
        msg["group"] = group.fields()
    return msg


def parse_group(msg: Mapping[str, Any]) -> Group | None:
    """The group a registration declares (None: none); PayloadError when it is malformed."""
    fields = msg.get("group") if isinstance(msg, Mapping) else None
    if fields is None:
        return None
    if not isinstance(fields, list) or len(fields) != 3:
        raise PayloadError(f"group must be [name, rank, size], got {brief(fields)}")
    try:
        return Group(*fields)
    except GroupError as e:
        raise PayloadError(str(e)) from None


def parse_register(msg: Mapping[str, Any]) -> tuple[int, str, dict[str, Dim]]:
    """(profile id, name, dims in record order) of a registration; PayloadError/ShapeError."""
    try:
        profile, name, pairs = msg["profile"], msg["name"], msg["dims"]
        if msg["op"] != "register":
            raise PayloadError(f"expected a registration, got op {brief(msg['op'])}")
        if isinstance(profile, bool) or not (
            isinstance(profile, int) and 0 <= profile <= MAX_PROFILE_ID
        ):
            raise PayloadError(f"profile id {brief(profile)} is outside [0, {MAX_PROFILE_ID}]")
        if not isinstance(name, str) or not name:
            raise PayloadError(f"profile name {brief(name)} is not a non-empty string")
        if not isinstance(pairs, list):
            raise PayloadError(f"dims must be a list of [name, fields], got {brief(pairs)}")
        items = [(k, dim_from_dict(v)) for k, v in pairs]
        dims = dict(items)
    except (KeyError, TypeError, ValueError) as e:
        if isinstance(e, (PayloadError, ShapeError)):
            raise
        raise PayloadError(f"malformed registration: {type(e).__name__}: {str(e)[:100]}") from None
    if len(dims) != len(items):
        raise ShapeError(f"profile {brief(name)} names a dim twice")
    return profile, name, check_profile(name, dims)


def snapshot_payload(device: int, gears: Mapping[str, Mapping[str, Gears]],
                     changes: Mapping[str, list[list[Any]]] | None = None,
                     groups: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The payload of a device's snapshot: per profile, gears per dim and last changes, and a
    grouped profile's group (`groups`: per profile, its name, size and usable variants)."""
    changes, groups = changes or {}, groups or {}
    out: dict[str, Any] = {"device": device, "profiles": {
        name: {"gears": {d: list(g) for d, g in dims.items()}, "changes": changes.get(name, [])}
        for name, dims in gears.items()}}
    for name, group in groups.items():
        if name in out["profiles"]:
            out["profiles"][name]["group"] = {**group, "usable": [list(v) for v in
                                                                  group["usable"]]}
    return out


def holds_message(profile: int, variants: Iterable[Sequence[int]], epoch: int = 0,
                  count: int = 0) -> dict[str, Any]:
    """A rank's report of the variants of profile id `profile` it holds, in `epoch` after
    `count` maintenances."""
    return {"op": "holds", "profile": profile, "variants": [list(v) for v in variants],
            "epoch": epoch, "count": count}


def _mark(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_MARK


def parse_holds(msg: Mapping[str, Any], ndim: int
                ) -> tuple[int, frozenset[tuple[int, ...]], tuple[int, int]]:
    """(profile id, variants, (epoch, count)) of a report of what a rank holds, each variant
    `ndim` gears, (0, 0) when it carries no epoch and count (an older worker); PayloadError
    when it is malformed or names more than MAX_HELD."""
    profile, variants = msg.get("profile"), msg.get("variants")
    if isinstance(profile, bool) or not isinstance(profile, int) or not (
            0 <= profile <= MAX_PROFILE_ID):
        raise PayloadError(f"profile id {brief(profile)} is outside [0, {MAX_PROFILE_ID}]")
    if not isinstance(variants, list) or len(variants) > MAX_HELD:
        raise PayloadError(f"variants must be a list of at most {MAX_HELD}, got {brief(variants)}")
    held = set()
    for v in variants:
        if not (isinstance(v, list) and len(v) == ndim and all(
                isinstance(g, int) and not isinstance(g, bool) and 0 < g < 2**63 for g in v)):
            raise PayloadError(f"a variant is {ndim} positive gears, got {brief(v)}")
        held.add(tuple(v))
    mark = (msg.get("epoch", 0), msg.get("count", 0))
    if not all(map(_mark, mark)):
        raise PayloadError(f"epoch and count must be integers in [0, {MAX_MARK}], got "
                           f"{brief(list(mark))}")
    return profile, frozenset(held), mark


def profile_usable(payload: Any, name: str) -> frozenset[tuple[int, ...]] | None:
    """The usable variants of grouped profile `name` in a snapshot payload; None when it is
    absent, of no group, or malformed."""
    try:
        usable = payload["profiles"][name]["group"]["usable"]
        return frozenset(tuple(int(g) for g in v) for v in usable)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def profile_usable_at(payload: Any, name: str) -> tuple[int, int] | None:
    """(epoch, least count) of the reports behind grouped profile `name`'s usable set, in a
    snapshot payload; None when the ranks' epochs differ, or it is absent or malformed."""
    try:
        at = payload["profiles"][name]["group"]["at"]
    except (AttributeError, KeyError, TypeError):
        return None
    if isinstance(at, list) and len(at) == 2 and all(map(_mark, at)):
        return at[0], at[1]
    return None


def profile_reported(payload: Any, name: str) -> bool:
    """Whether every rank of grouped profile `name` has reported what it holds, in a snapshot
    payload; False when it is absent or malformed."""
    try:
        return payload["profiles"][name]["group"]["reported"] is True
    except (AttributeError, KeyError, TypeError):
        return False


def profile_replaced(payload: Any, name: str) -> int | None:
    """How many times a rank of grouped profile `name` was declared by another worker than
    the one that held it (as the publishing controller counted), in a snapshot payload; None
    when it is absent or malformed."""
    try:
        replaced = payload["profiles"][name]["group"]["replaced"]
    except (AttributeError, KeyError, TypeError):
        return None
    return replaced if isinstance(replaced, int) and not isinstance(replaced, bool) else None


def profile_gears(payload: Any, name: str) -> dict[str, Gears] | None:
    """Gears per dim of profile `name` in a snapshot payload, or None when it is absent."""
    try:
        dims = payload["profiles"][name]["gears"]
        return {d: tuple(int(g) for g in gs) for d, gs in dims.items()}
    except (AttributeError, KeyError, TypeError, ValueError):
        return None


def profile_changes(payload: Any, name: str) -> list[tuple[str, int, str, str]]:
    """The last round's changes of profile `name` in a snapshot payload, (dim, gear, action,
    reason) each; the malformed ones left out, none when it is absent."""
    try:
        changes = payload["profiles"][name]["changes"]
        rows = list(changes) if isinstance(changes, list) else []
    except (AttributeError, KeyError, TypeError):
        return []
    out = []
    for c in rows:
        if (isinstance(c, list) and len(c) == 4 and isinstance(c[0], str) and isinstance(c[2], str)
                and isinstance(c[3], str) and isinstance(c[1], int) and not isinstance(c[1], bool)):
            out.append((c[0], c[1], c[2], c[3]))
    return out
