"""A group across a controller restart (`statefile` saves, `stateformat` restores): the ranks,
alive all along, keep the group's gears (no device round decides their profile on its own, no
early group round, so nothing to recapture), the group's members and the time of its last round
come back before any rank registers again, and the usable set is rebuilt from the ranks'
reports; a group entry the file holds wrong is left out naming the group, the controller up."""

from __future__ import annotations

import logging
from pathlib import Path

import msgpack
import pytest
from fakeclock import FakeClock

from gearshift import protocol
from gearshift.controller import statefile
from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller
from gearshift.controller.groups import Member
from gearshift.core.config import PolicyConfig
from gearshift.core.group import Group
from gearshift.tools.simulate import policy_dims

from .test_grouprounds import _register, _usable
from .test_one_round import _trace
from .workers import Worker

KEY = ("tp", "trace")
POLICY = PolicyConfig(add_min_samples=3, update_interval_seconds=300.0).scaled(60.0)


def _fed(policy: PolicyConfig, namespace: str, state: Path, clock: FakeClock
         ) -> tuple[list[Worker], dict]:
    """Two ranks (devices 0 and 1) of group tp fed until the group's round changed its gears,
    then the controller closed (its final save); the ranks stay. Rank 0 (the recorder) records
    the trace, rank 1 other sizes (which a device round of device 1 would follow)."""
    trace = _trace(7)
    dims = policy_dims(trace, "adaptive")
    controller = Controller.open(ControllerConfig(namespace=namespace, state_dir=str(state)),
                                 policy, clock=clock)
    ranks = [Worker(namespace, r, clock, capacity=1 << 14) for r in range(2)]
    try:
        for r, w in enumerate(ranks):
            _register(w, Group("tp", r, 2), dims, controller)
        start = ranks[0].gears("trace")
        for t, size in zip(trace.t, trace.dims["BATCHSIZE"], strict=True):
            assert ranks[0].put(0, int(size), t=float(t))
            assert ranks[1].put(0, 47, t=float(t))
        while ranks[0].gears("trace") == start:
            assert clock.now() < trace.t[-1], "the group's gears never changed"
            clock.advance(policy.check_interval_seconds)
            controller.step()
        last = controller.group_rounds.last_update[KEY]
        assert last == clock.now()
    except BaseException:
        for w in ranks:
            w.close()
        raise
    finally:
        controller.close()
    return ranks, dims


def test_a_restarted_controller_keeps_the_group_s_gears_members_and_timeline(
    namespace: str, tmp_path: Path
) -> None:
    clock = FakeClock(0.0)
    ranks, dims = _fed(POLICY, namespace, tmp_path, clock)
    gears = [w.gears("trace") for w in ranks]
    last = clock.now()
    try:
        assert gears[0] == gears[1]
        controller = Controller.open(ControllerConfig(namespace=namespace,
                                                      state_dir=str(tmp_path)), POLICY,
                                     clock=clock)
        try:
            members = controller.group_rounds.groups.profiles[KEY]
            assert members.size == 2 and members.holds == {}
            assert members.ranks == {r: Member(w.slot, members.ranks[r].pid, r)
                                     for r, w in enumerate(ranks)}
            assert controller.group_rounds.last_update[KEY] == last
            assert [controller.devices[d].profiles["trace"].group for d in (0, 1)] == ["tp"] * 2
            for _ in range(3):  # device rounds are due; the group's is not yet
                clock.advance(POLICY.check_interval_seconds)
                controller.step()
            assert [w.gears("trace") for w in ranks] == gears  # nothing to recapture
            assert controller.group_rounds.rounds == 0 and controller.group_rounds.degraded == {}
            for r, w in enumerate(ranks):  # the ranks register again, then report what they hold
                _register(w, Group("tp", r, 2), dims, controller)
            assert _usable(ranks[0]) is None  # no rank has reported yet: nothing is usable
            for w in ranks:
                assert w.registry.requests(w.slot).post(protocol.holds_message(0, [(48,)]))
                controller.step()
            assert _usable(ranks[0]) == _usable(ranks[1]) == {(48,)}
            assert controller.group_rounds.rounds == 0  # registering again decides nothing
            clock.advance(last + POLICY.update_interval_seconds - clock.now())
            controller.step()
            assert controller.group_rounds.rounds == 1  # the group's timeline goes on
        finally:
            for w in ranks:
                w.close()
            controller.close()
    finally:
        for w in ranks:
            w.close()


def test_a_group_the_state_file_holds_wrong_is_left_out_naming_it_and_the_controller_starts(
    namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock(0.0)
    ranks, _ = _fed(POLICY, namespace, tmp_path, clock)
    try:
        file = tmp_path / statefile.STATE_FILE
        data = msgpack.unpackb(file.read_bytes(), strict_map_key=False)
        (entry,) = data["groups"]
        entry["ranks"][1][0] = 5  # rank 5 of a group of 2
        file.write_bytes(msgpack.packb(data))
        with caplog.at_level(logging.WARNING, "gearshift"), Controller.open(
                ControllerConfig(namespace=namespace, state_dir=str(tmp_path)), POLICY,
                clock=clock) as controller:
            assert controller.group_rounds.groups.profiles == {}
            assert controller.devices[0].profiles["trace"].gear_lists() == {
                "BATCHSIZE": list(ranks[0].gears("trace")["BATCHSIZE"])}
            for w in ranks:
                w.close()
        assert "group 'tp' not restored: StateError: rank 5 is outside [0, 1]" in caplog.text
    finally:
        for w in ranks:
            w.close()
