"""Profile registrations: each slot's request mailbox answered in its reply mailbox.

A profile is (the slot's device, name). A name new to the device is created (seeded from the
initial gears when they have it); a known name must be declared with the same dims in the same
order, else the worker is refused with ProfileMismatch naming the live worker that holds it;
with no live holder the re-declaration replaces the profile (its learned gears are reset). The
worker's local id then maps to the profile's global key, and the reply carries the device's
snapshot version. A device holds at most MAX_PROFILES profiles (NamespaceBusy beyond), and a
new profile is kept only once the device's snapshot with it is published: one that does not fit
the snapshot region is refused alone (PayloadError naming the limit), the device as it was.
`admit` holds the checks and needs only a `Registrar` (the state side). The controller's
`Registrations` is one, and returns the answer as effects (`effects`) that the controller
applies in order: the new profile published and saved, the worker's id mapped and the status
document published, then the reply.

Each slot is served on its own: a request that cannot be read or answered, or a reply that
cannot be posted, fails that slot alone, and every refusal is a short message. A rank of
a group (`protocol.parse_group`) is checked against the group's live members and recorded
(`controller.groups.Groups`), and its reply echoes the group's name. Warnings
about one slot are logged at most every QUIET_SECONDS (with the count of those left out), so a
worker posting junk flat out cannot flood the log.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gearshift.controller.config import InitialGears
from gearshift.controller.effects import (
    Added,
    Effect,
    ForgetCosts,
    Log,
    Map,
    Publish,
    PublishStatus,
    Reply,
    Save,
)
from gearshift.controller.groups import Groups, Member
from gearshift.controller.slots import Slots
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import MAX_DIMS, Dim, Gears, brief
from gearshift.core.gears import starting_gears
from gearshift.core.round import DeviceLedger, ProfileLedger
from gearshift.errors import (
    GearshiftError,
    NamespaceBusy,
    PayloadError,
    ProfileMismatch,
    ShapeError,
    SpaceError,
)
from gearshift.protocol import parse_group, parse_holds, parse_register
from gearshift.shm import Registry, error_reply

log = logging.getLogger(__name__)

REFUSED = (PayloadError, ShapeError, ProfileMismatch, NamespaceBusy, SpaceError)  # answered
MAX_PROFILES = 256  # profiles per device
QUIET_SECONDS = 10.0  # a slot's warnings are logged at most this often
_quiet: dict[int, tuple[float, int]] = {}  # slot -> (logged again from, warnings left out)
Seed = Callable[[int, str, Mapping[str, Dim]], Mapping[str, Gears] | None]  # start-up gears


@dataclasses.dataclass(frozen=True)
class Request:
    """A parsed registration: the worker's local profile id, the profile's name and dims."""

    local: int
    name: str
    dims: dict[str, Dim]


class Registrar(Protocol):
    """What `admit` needs to know; `now` is the controller's time."""

    def claimant(self, slot: int, now: float) -> tuple[int, int]:
        """(device, pid) of the live worker holding `slot`; NamespaceBusy if there is none."""
        ...

    def dims_of(self, device: int, name: str) -> Mapping[str, Dim] | None:
        """The dims of profile `name` on `device`; None if the device does not know it."""
        ...

    def holder(self, device: int, name: str, slot: int) -> int | None:
        """The pid of a live worker other than `slot`'s that registered `name` on `device`."""
        ...


def take(registry: Registry, slot: int, now: float) -> dict | Reply | None:
    """`slot`'s waiting request (None: there is none), or the `Reply` refusing an unreadable one."""
    try:
        return registry.requests(slot).take()
    except PayloadError as e:
        return Reply(slot, refusal(slot, e, now))


def post(registry: Registry, slot: int, reply: dict, now: float) -> None:
    """Post `reply` in `slot`'s reply mailbox (lost, and said, if the last one was not taken)."""
    if not registry.replies(slot).post(reply):
        _warn(slot, now, "slot %d has not taken its previous reply; this one is lost", slot)


REGISTERED = "pid %d (slot %d) registered profile %r on device %d as id %d"


def admit(registrar: Registrar, slot: int, message: Mapping[str, Any],
          now: float) -> tuple[Request, int, int, bool]:
    """`slot`'s registration `message` parsed and checked against the profiles of the worker's
    device: (request, device, pid, whether it needs a new profile); raises the refusal."""
    request = Request(*parse_register(message))
    device, pid = registrar.claimant(slot, now)
    known = registrar.dims_of(device, request.name)
    new = check(request, device, pid, known, lambda: registrar.holder(device, request.name, slot))
    return request, device, pid, new


def failure(slot: int, error: Exception, now: float) -> dict:
    """The reply refusing `slot`'s registration for `error`: a refusal's own, or a failure of
    ours (logged with its traceback), which the worker still hears of, in one line."""
    if isinstance(error, REFUSED):
        return refusal(slot, error, now)
    log.error("slot %d: registration failed", slot, exc_info=error)
    return refusal(slot, GearshiftError(
        f"the controller failed to register it: {type(error).__name__}: {str(error)[:100]}"), now)


def check(
    request: Request,
    device: int,
    pid: int,
    known: Mapping[str, Dim] | None,
    holder: Callable[[], int | None],
) -> bool:
    """Whether `request` of worker `pid` needs a new profile: True when its name is new to the
    device (`known` None) or re-declared with other dims while no other live worker (`holder()`)
    holds it; False when `known` has the same dims in the same order. ProfileMismatch else."""
    if known is None:
        return True
    if list(known.items()) == list(request.dims.items()):
        return False
    held_by = holder()
    if held_by is not None:
        raise ProfileMismatch(
            f"profile {request.name!r} on device {device} is registered by pid {held_by} "
            f"with other dims ({_describe(known)}); pid {pid} declares {_describe(request.dims)}"
        )
    log.warning(
        "profile %r on device %d re-declared as %s: its learned gears are reset",
        request.name,
        device,
        _describe(request.dims),
    )
    return True


def refusal(slot: int, error: GearshiftError, now: float) -> dict:
    """The reply refusing `slot`'s request with `error` (raised as its type in the worker)."""
    _warn(slot, now, "slot %d: registration refused: %s", slot, error)
    return error_reply(error)


def _warn(slot: int, now: float, message: str, *args: object) -> None:
    """log.warning about `slot`, at most every QUIET_SECONDS of the controller's time."""
    until, left_out = _quiet.get(slot, (-math.inf, 0))
    if until - QUIET_SECONDS <= now < until:  # (an earlier `now`: another clock, start again)
        _quiet[slot] = until, left_out + 1
        return
    _quiet[slot] = now + QUIET_SECONDS, 0
    if left_out:
        message += f" ({left_out} more about slot {slot} in the last {QUIET_SECONDS:g} s)"
    log.warning(message, *args)


def new_profile(
    device: int,
    name: str,
    dims: dict[str, Dim],
    now: float,
    policy: PolicyConfig,
    initial_gears: InitialGears,
) -> ProfileLedger:
    """A fresh ledger; its gears from `initial_gears` (the device's, else the first device's
    that has the profile) when they fit the dims, else the dims' initial gears."""
    profile = ProfileLedger.new(dims, now, policy)
    seeded = initial_gears.get(device, {}).get(name) or next(
        (p[name] for _, p in sorted(initial_gears.items()) if name in p), None
    )
    if seeded:
        try:
            profile.gears = starting_gears(
                {
                    d: dataclasses.replace(dim, gears=seeded.get(d, dim.initial_gears))
                    for d, dim in dims.items()
                },
                now,
            )
        except ShapeError as e:
            log.warning("initial gears of %r ignored: %s", name, e)
    return profile


class Registrations:
    """The controller's registrations over its `slots` and `devices`, answered as effects.

    A registration is served for any slot the controller follows, its worker alive or gone but
    not reclaimed yet (what it recorded is then attributed); the controller scans the slot table
    again first if a request comes before the scan that sees its slot. `plan` returns, in order:
    for a new profile (added to the ledger at once), `Publish` (the profile kept only if that
    succeeds: a SpaceError for its region or a PayloadError refuses it, the device as it was),
    `ForgetCosts` (what was measured of a profile declared anew) and `Save`; then `Map` (the
    worker's id), `PublishStatus` (before the reply, so that a successor maps the worker's id
    even if this controller dies right after answering), `Log` and the `Reply`.
    """

    def __init__(self, slots: Slots, devices: dict[int, DeviceLedger], policy: PolicyConfig,
                 initial_gears: InitialGears) -> None:
        self.slots = slots
        self.devices = devices
        self.policy = policy
        self.initial_gears = initial_gears
        self.seed: Seed = lambda device, name, dims: None  # the fleet's gears (`fleet.seed`)
        self.groups = Groups(self._alive)

    def _alive(self, slot: int, pid: int) -> bool:
        w = self.slots.workers.get(slot)
        return w is not None and w.info.alive and w.info.pid == pid

    def claimant(self, slot: int, now: float) -> tuple[int, int]:
        w = self.slots.workers.get(slot)
        if w is None:
            raise NamespaceBusy(f"slot {slot} is not held by a worker")
        return w.info.device, w.info.pid

    def dims_of(self, device: int, name: str) -> Mapping[str, Dim] | None:
        profile = self.devices.get(device, DeviceLedger()).profiles.get(name)
        return profile.dims if profile is not None else None

    def holder(self, device: int, name: str, slot: int) -> int | None:
        w = self.slots.workers[slot]
        other = next(
            (
                o
                for o in self.slots.workers.values()
                if o is not w
                and o.info.alive
                and o.info.device == device
                and name in o.profiles.values()
            ),
            None,
        )
        return other.info.pid if other is not None else None

    def plan(self, slot: int, message: Mapping[str, Any], now: float) -> list[Effect]:
        """The effects answering `slot`'s registration `message` (see the class docstring), or
        the `Reply` refusing it."""
        if isinstance(message, Mapping) and message.get("op") == "holds":
            return self._holds(slot, message, now)
        try:
            request, device, pid, new = admit(self, slot, message, now)
            group = parse_group(message)
            if group is not None:
                self.groups.check(group, request.name, request.dims, slot, pid)
            added = self._add(slot, device, request, now) if new else []
        except Exception as e:
            return [Reply(slot, failure(slot, e, now))]
        name, local = request.name, request.local
        reply: dict[str, Any] = {"op": "registered", "profile": local}
        if group is not None:  # the echo: a worker refuses a reply without it (no groups)
            added += [Publish(d) for d in self.groups.join(
                group, name, request.dims, Member(slot, pid, device))]
            reply["group"] = group.name
        return [*added, Map(slot, local, device, name), PublishStatus(),
                Log(__name__, REGISTERED, (pid, slot, name, device, local)),
                Reply(slot, reply, version_of=device)]

    def _holds(self, slot: int, message: Mapping[str, Any], now: float) -> list[Effect]:
        """A rank's report of what it holds (no reply): the group's usable set updated, and
        every member device's snapshot published when it changed; a bad report is logged."""
        w = self.slots.workers.get(slot)
        try:
            local = message.get("profile")
            name = w.profiles.get(local) if w is not None and isinstance(local, int) else None
            dims = self.dims_of(w.info.device, name) if w is not None and name else None
            if dims is None:
                raise PayloadError(f"profile id {brief(local)} is not registered by slot {slot}")
            _, variants, mark = parse_holds(message, len(dims))
        except PayloadError as e:
            _warn(slot, now, "slot %d: report of what it holds ignored: %s", slot, e)
            return []
        changed = self.groups.hold(slot, name, variants, mark)
        return [Publish(d) for d in changed or ()]

    def _add(self, slot: int, device: int, request: Request, now: float) -> list[Effect]:
        dev = self.devices.setdefault(device, DeviceLedger())
        name = request.name
        if name not in dev.profiles and len(dev.profiles) >= MAX_PROFILES:
            raise NamespaceBusy(f"device {device} holds {MAX_PROFILES} profiles: no more")
        previous = dev.profiles.get(name)
        seed = self.seed(device, name, request.dims)
        dev.profiles[name] = new_profile(device, name, request.dims, now, self.policy,
                                         {device: {name: seed}} if seed else self.initial_gears)
        return [Publish(device, Added(slot, device, name, previous)), ForgetCosts(device, name),
                Save()]

    def withdraw(self, added: Added, error: BaseException) -> BaseException:
        """Put `added`'s device back as it was, its snapshot not published for `error`; returns
        the error to refuse the registration with (PayloadError naming the limit when the
        profile does not fit)."""
        profiles = self.devices[added.device].profiles
        if added.previous is None:
            profiles.pop(added.name, None)
        else:
            profiles[added.name] = added.previous
        if isinstance(error, PayloadError):
            return PayloadError(
                f"profile {added.name!r} not registered on device {added.device}: {error} (a "
                f"region holds {MAX_PROFILES} profiles of {MAX_DIMS} dims of 64 gears); register "
                "fewer gears or profiles")
        return error


def _describe(dims: Mapping[str, Dim]) -> str:
    return ", ".join(f"{name}={dim}" for name, dim in dims.items())
