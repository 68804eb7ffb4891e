"""The registration checks on their own: `admit` and `failure` over a stub Registrar (and the
controller's Registrations over fake slots), no shared memory, no controller."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace

import pytest
from worker.fake_controller import answer

from gearshift import protocol
from gearshift.controller import registrations
from gearshift.controller.effects import (
    Added,
    ForgetCosts,
    Log,
    Map,
    Publish,
    PublishStatus,
    Reply,
    Save,
)
from gearshift.controller.registrations import Registrations, Request
from gearshift.controller.slots import Worker
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim
from gearshift.core.round import DeviceLedger
from gearshift.errors import GearshiftError, NamespaceBusy, PayloadError, ProfileMismatch
from gearshift.shm import SlotInfo, SlotState, raise_for_error

B = {"B": Dim(max=64)}
BS = {"B": Dim(max=64), "S": Dim(max=512)}


class Stub:
    """Device 3, pid 7 in slot 1; `known` its profiles, `held` their live holders' pids."""

    def __init__(self, known: dict[str, dict[str, Dim]], held: dict[str, int]) -> None:
        self.known, self.held = known, held
        self.recorded: list[tuple[int, Request, bool]] = []

    def claimant(self, slot: int, now: float) -> tuple[int, int]:
        if slot != 1:
            raise NamespaceBusy(f"slot {slot} is not held by a live worker")
        return 3, 7

    def dims_of(self, device: int, name: str) -> Mapping[str, Dim] | None:
        return self.known.get(name)

    def holder(self, device: int, name: str, slot: int) -> int | None:
        return self.held.get(name)

    def register(self, slot: int, request: Request, new: bool, now: float) -> int:
        self.recorded.append((slot, request, new))
        return 11


def _answer(stub: Stub, dims: dict[str, Dim], slot: int = 1) -> dict:
    return answer(stub, slot, protocol.register_message(5, "decode", dims), 0.0)


def test_a_new_or_identical_profile_is_registered_and_the_reply_has_the_version() -> None:
    stub = Stub({"other": B}, {})
    assert _answer(stub, B) == {"op": "registered", "profile": 5, "version": 11}
    stub.known["decode"] = dict(B)
    assert _answer(stub, B)["version"] == 11
    assert [new for _, _, new in stub.recorded] == [True, False]
    assert stub.recorded[0][1] == Request(5, "decode", B)


def test_other_dims_are_refused_while_a_live_worker_holds_the_name() -> None:
    stub = Stub({"decode": B}, {"decode": 42})
    with pytest.raises(ProfileMismatch, match="registered by pid 42 with other"):
        raise_for_error(_answer(stub, BS))
    assert stub.recorded == []


def test_other_dims_or_order_replace_the_profile_when_nobody_holds_it() -> None:
    stub = Stub({"decode": {"S": BS["S"], "B": BS["B"]}}, {})
    assert _answer(stub, BS)["op"] == "registered"  # same dims, another order: a new profile
    assert stub.recorded[0][2] is True


def test_a_malformed_request_or_a_slot_without_a_worker_is_refused() -> None:
    stub = Stub({}, {})
    refusal = answer(stub, 1, {"op": "register", "profile": -1}, 0.0)
    assert refusal["error"] == "PayloadError"
    assert _answer(stub, B, slot=2)["error"] == "NamespaceBusy"
    assert stub.recorded == []


def test_a_failure_of_the_controller_is_answered_not_left_unreplied() -> None:
    class Failing(Stub):
        def register(self, slot: int, request: Request, new: bool, now: float) -> int:
            raise OverflowError("cannot convert float infinity to integer")

    reply = _answer(Failing({}, {}), B)
    with pytest.raises(GearshiftError, match="failed to register it: OverflowError: cannot"):
        raise_for_error(reply)


def test_a_slot_refused_flat_out_is_logged_at_most_every_quiet_period(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stub = Stub({}, {})
    with caplog.at_level("WARNING", logger=registrations.__name__):
        for i in range(50):  # junk at 100 Hz for half a second, then once more 10 s later
            answer(stub, 1, {"op": "junk"}, 1000.0 + i / 100)
        answer(stub, 1, {"op": "junk"}, 1010.5)
    assert len(caplog.records) == 2
    assert "(49 more about slot 1 in the last 10 s)" in caplog.records[1].getMessage()


def _registrations(devices: dict[int, DeviceLedger]) -> Registrations:
    """The controller's Registrations over one live worker: pid 7 in slot 1, on device 3."""
    info = SlotInfo(1, SlotState.ACTIVE, 7, True, 3, 1, 0, 0, 0)
    slots = SimpleNamespace(workers={1: Worker(info)})
    return Registrations(slots, devices, PolicyConfig(), {})  # type: ignore[arg-type]


def test_a_new_profile_is_published_and_saved_before_the_reply() -> None:
    devices: dict[int, DeviceLedger] = {}
    effects = _registrations(devices).plan(1, protocol.register_message(5, "decode", B), 0.0)
    assert [type(e) for e in effects] == [Publish, ForgetCosts, Save, Map, PublishStatus, Log,
                                          Reply]
    assert effects[0] == Publish(3, Added(1, 3, "decode", None))
    assert effects[-1] == Reply(1, {"op": "registered", "profile": 5}, version_of=3)
    assert "decode" in devices[3].profiles  # added now, kept only if the publish succeeds
    again = _registrations(devices).plan(1, protocol.register_message(6, "decode", B), 0.0)
    assert [type(e) for e in again] == [Map, PublishStatus, Log, Reply]  # known: nothing new


def test_a_profile_whose_snapshot_does_not_publish_is_withdrawn_and_refused_naming_the_limit(
) -> None:
    devices: dict[int, DeviceLedger] = {}
    registrations_ = _registrations(devices)
    publish = registrations_.plan(1, protocol.register_message(5, "decode", B), 0.0)[0]
    assert isinstance(publish, Publish) and publish.added is not None
    error = registrations_.withdraw(publish.added, PayloadError("4096 bytes exceed 1024"))
    assert "decode" not in devices[3].profiles
    assert isinstance(error, PayloadError)
    assert "profile 'decode' not registered on device 3: 4096 bytes exceed 1024" in str(error)
    refused = registrations_.plan(1, {"op": "junk"}, 0.0)
    assert len(refused) == 1 and isinstance(refused[0], Reply)
    assert refused[0].message["error"] == "PayloadError"


def test_a_rank_of_a_group_is_recorded_and_its_reply_echoes_the_group() -> None:
    from gearshift.core.group import Group

    devices: dict[int, DeviceLedger] = {}
    regs = _registrations(devices)
    message = protocol.register_message(5, "decode", B, Group("tp", 1, 2))
    effects = regs.plan(1, message, 0.0)
    assert effects[-1] == Reply(1, {"op": "registered", "profile": 5, "group": "tp"},
                                version_of=3)
    assert regs.groups.missing(("tp", "decode")) == [0]
    refused = regs.plan(1, protocol.register_message(6, "decode", B, Group("tp", 1, 4)), 0.0)
    with pytest.raises(ProfileMismatch, match="has 2 ranks"):
        raise_for_error(refused[-1].message)
    malformed = regs.plan(1, {**message, "group": ["tp", 5, 2]}, 0.0)
    with pytest.raises(PayloadError, match="rank 5"):
        raise_for_error(malformed[-1].message)


def test_a_report_of_what_a_rank_holds_is_never_answered_and_a_bad_one_is_ignored() -> None:
    devices: dict[int, DeviceLedger] = {}
    regs = _registrations(devices)
    assert regs.plan(1, protocol.holds_message(9, [(8,)]), 0.0) == []  # id 9: not registered
    regs.plan(1, protocol.register_message(5, "decode", B), 0.0)
    regs.slots.workers[1].profiles[5] = "decode"  # the Map effect, applied
    assert regs.plan(1, protocol.holds_message(5, [(8, 8)]), 0.0) == []  # wrong arity
    assert regs.plan(1, protocol.holds_message(5, [(8,)]), 0.0) == []  # of no group: nothing
