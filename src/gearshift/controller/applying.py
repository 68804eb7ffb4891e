"""The controller's side of the effects (`effects`): `Applying`, a base of `Controller`.

`_apply` applies a list in order. A failing `Save`, `PublishStatus`, `Measured` or `Inherit` is
counted and logged (`_failed`) and the list goes on; any other failing effect drops the rest of
its list, and where the list ends in a `Reply` (a registration's) the worker is refused with the
error instead (a `Publish` of an `Added` profile withdraws it first). Registrations are served
slot by slot (`_serve_slot`): the request taken, the slot table scanned again if its slot is
not followed yet, the answer planned (`Registrations.plan`) and applied, so that the new
profile's snapshot is published and saved, and the status document published, before the reply.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

from gearshift.clock import Clock
from gearshift.controller import registrations, status
from gearshift.controller.costbook import CostBook
from gearshift.controller.effects import (
    Effect,
    Failed,
    ForgetCosts,
    Inherit,
    Log,
    Map,
    Measured,
    Publish,
    PublishStatus,
    Reclaim,
    Reply,
    Save,
)
from gearshift.controller.ingest import ProfileKeys
from gearshift.controller.registrations import Registrations
from gearshift.controller.slots import Slots
from gearshift.core.round import DeviceLedger
from gearshift.shm import Registry

log = logging.getLogger("gearshift.controller.controller")  # the loop's failures, as before

ERROR_LOG_SECONDS = 10.0  # an error repeating in a phase is logged at most this often


class Applying:
    """Applies the effects of the controller's parts; what it uses of the controller is
    declared here and set by `Controller.__init__`."""

    clock: Clock
    registry: Registry
    slots: Slots
    registrations: Registrations
    costs: CostBook
    devices: dict[int, DeviceLedger]
    profile_keys: ProfileKeys
    errors: int
    _logged: dict[str, float]
    _previous: dict[str, Any] | None  # the last status document, while opening
    _publish: Callable[[int, float], None]
    _save: Callable[[], None]
    _publish_status: Callable[[float], None]
    _scan: Callable[[float, int | None], None]

    def _guard(self, what: str, fn: Callable[..., object], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as e:
            self._failed(what, e)

    def _failed(self, what: str, error: Exception) -> None:
        """Count a failure and log it with its traceback, at most every ERROR_LOG_SECONDS."""
        self.errors += 1
        now = self.clock.now()
        if now - self._logged.get(what, -math.inf) >= ERROR_LOG_SECONDS:
            self._logged[what] = now
            log.error("%s failed; the loop goes on", what, exc_info=error)

    def _serve(self, now: float) -> None:
        """Answer every waiting registration, each slot's on its own."""
        for slot in range(self.slots.high_water()):
            self._guard(f"registration of slot {slot}", self._serve_slot, slot, now)

    def _serve_slot(self, slot: int, now: float) -> None:
        if slot not in self.slots.workers and self.registry.requests(slot).waiting():
            busy = self.slots.lock_busy  # a request may come before its slot's scan
            self._scan(now, slot)
            if slot not in self.slots.workers and self.slots.lock_busy != busy:
                return  # the lock was busy (a dead holder's, being repaired): next iteration
        taken = registrations.take(self.registry, slot, now)
        if isinstance(taken, dict):
            self._apply(self.registrations.plan(slot, taken, now), now)
        elif taken is not None:
            self._apply([taken], now)

    def _apply(self, effects: Sequence[Effect], now: float) -> None:
        """Apply `effects` in order (see the module docstring)."""
        for i, effect in enumerate(effects):
            try:
                self._apply_one(effect, now)
            except BaseException as e:
                if isinstance(effect, Publish) and effect.added is not None:
                    e = self.registrations.withdraw(effect.added, e)
                reply = next((r for r in effects[i + 1:] if isinstance(r, Reply)), None)
                if reply is None or not isinstance(e, Exception):
                    raise e from None
                message = registrations.failure(reply.slot, e, now)
                registrations.post(self.registry, reply.slot, message, now)
                return

    def _apply_one(self, effect: Effect, now: float) -> None:
        if isinstance(effect, Failed):
            self._failed(effect.what, effect.error)
        elif isinstance(effect, Inherit):
            self._guard(f"slot {effect.slot}", self._inherit, effect.slot)
        elif isinstance(effect, Measured):
            self._guard(f"measurements of slot {effect.slot}", self.costs.take, effect.events,
                        effect.keys, self._profile_of)
        elif isinstance(effect, Reclaim):
            self._guard(f"registration of slot {effect.slot}", self._serve_slot, effect.slot,
                        now)
            self._apply(self.slots.reclaim(effect.slot, now), now)
        elif isinstance(effect, Publish):
            self._publish(effect.device, now)
        elif isinstance(effect, ForgetCosts):
            self.costs.forget(effect.device, effect.name)
        elif isinstance(effect, Save):
            self._guard("state save", self._save)
        elif isinstance(effect, Map):
            key = self.profile_keys.key(effect.device, effect.name)
            self.slots.workers[effect.slot].map(effect.local, key, effect.name)
        elif isinstance(effect, PublishStatus):
            self._guard("status", self._publish_status, now)
        elif isinstance(effect, Log):
            logging.getLogger(effect.logger).info(effect.message, *effect.args)
        else:
            message = effect.message
            if effect.version_of is not None:
                message = {**message, "version": self.devices[effect.version_of].version}
            registrations.post(self.registry, effect.slot, message, now)

    def _inherit(self, slot: int) -> None:
        """Map the profile ids that the previous controller's last status document lists for
        this claim of the slot, so that events already in the ring are folded (on open)."""
        w = self.slots.workers[slot]
        profiles = self.devices.get(w.info.device, DeviceLedger()).profiles
        for local, name in status.profile_ids(self._previous, w.info):
            if name in profiles:
                w.map(local, self.profile_keys.key(w.info.device, name), name)

    def _profile_of(self, key: int) -> tuple[int, str, Any]:
        device, name = self.profile_keys.profile_by_key[key]
        return device, name, self.devices.get(device, DeviceLedger()).profiles.get(name)
