"""One decision per group in the controller: two ranks on two devices, fed the same steps in
fake time, are published the group's one gear set, the one the simulator decides for a group
of two (the shared round), decided from the recorder's records alone; a group with a missing
rank gets no new gears."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fakeclock import FakeClock

from gearshift import protocol
from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller
from gearshift.core.config import PolicyConfig
from gearshift.core.group import Group
from gearshift.shm import mailbox
from gearshift.tools.simulate import policy_dims, simulate

from .test_one_round import _trace
from .workers import WAIT, Worker


def _register(worker: Worker, group: Group, dims: dict, controller: Controller) -> dict:
    assert worker.registry.requests(worker.slot).post(
        protocol.register_message(0, "trace", dims, group))
    deadline = time.monotonic() + WAIT
    while (reply := worker.registry.replies(worker.slot).take()) is None:
        assert time.monotonic() < deadline, "no registration reply"
        controller.step()
    return mailbox.raise_for_error(reply)


@pytest.mark.parametrize("mode", ["plan", "rules"])
def test_the_ranks_are_published_the_group_s_one_decision(
    mode: str, namespace: str, tmp_path: Path
) -> None:
    policy = PolicyConfig(policy_mode=mode, add_min_samples=3).scaled(60.0)
    trace = _trace(7)
    dims = policy_dims(trace, "adaptive")
    expected = simulate(trace, dims, policy, ranks=2).dims["BATCHSIZE"].gears
    clock = FakeClock(0.0)
    controller = Controller.open(ControllerConfig(namespace=namespace, state_dir=str(tmp_path)),
                                 policy, clock=clock)
    ranks = [Worker(namespace, r, clock, capacity=1 << 14) for r in range(2)]
    try:
        for r, w in enumerate(ranks):
            assert _register(w, Group("tp", r, 2), dims, controller)["group"] == "tp"
        controller.step()
        published = [[w.gears("trace")["BATCHSIZE"] for w in ranks]]
        times, sizes = trace.t, trace.dims["BATCHSIZE"]
        sent = 0
        for k in range(1, len(expected)):
            check = k * policy.check_interval_seconds
            while sent < len(times) and times[sent] < check:  # every rank serves every step;
                for w in ranks[:1] if sent % 3 else ranks:  # rank 1 records a third of them:
                    assert w.put(0, int(sizes[sent]), t=float(times[sent]))  # not read
                sent += 1
            clock.advance(check - clock.now())
            controller.step()
            published.append([w.gears("trace")["BATCHSIZE"] for w in ranks])
    finally:
        for w in ranks:
            w.close()
        controller.close()
    assert len(set(expected)) > 1  # the gears moved
    assert [p[0] for p in published] == list(expected)  # the simulator's group round
    assert all(p[0] == p[1] for p in published)  # both devices: the group's one gear set
    assert controller.group_rounds.rounds > 0


def test_a_group_with_a_missing_rank_is_degraded_and_gets_no_new_gears(
    namespace: str, tmp_path: Path
) -> None:
    policy = PolicyConfig(add_min_samples=3).scaled(60.0)
    trace = _trace(3)
    dims = policy_dims(trace, "adaptive")
    clock = FakeClock(0.0)
    controller = Controller.open(ControllerConfig(namespace=namespace, state_dir=str(tmp_path)),
                                 policy, clock=clock)
    rank0 = Worker(namespace, 0, clock, capacity=1 << 14)
    try:
        _register(rank0, Group("tp", 0, 2), dims, controller)
        start = rank0.gears("trace")
        for t, size in zip(trace.t, trace.dims["BATCHSIZE"], strict=True):
            assert rank0.put(0, int(size), t=float(t))
        for _ in range(40):
            clock.advance(policy.check_interval_seconds)
            controller.step()
        assert controller.group_rounds.degraded == {("tp", "trace"): [1]}
        assert rank0.gears("trace") == start and controller.group_rounds.rounds == 0
    finally:
        rank0.close()
        controller.close()


def _usable(worker: Worker) -> frozenset | None:
    snap = worker.snapshot()
    return protocol.profile_usable(snap[1], "trace") if snap else None


def test_the_usable_set_is_what_every_rank_reports_and_is_published_to_each(
    namespace: str, tmp_path: Path
) -> None:
    policy = PolicyConfig()
    dims = {"BATCHSIZE": policy_dims(_trace(3), "adaptive")["BATCHSIZE"]}
    clock = FakeClock(0.0)
    controller = Controller.open(ControllerConfig(namespace=namespace, state_dir=str(tmp_path)),
                                 policy, clock=clock)
    ranks = [Worker(namespace, r, clock) for r in range(2)]
    try:
        for r, w in enumerate(ranks):
            _register(w, Group("tp", r, 2), dims, controller)

        def report(w: Worker, *gears: int) -> None:
            assert w.registry.requests(w.slot).post(
                protocol.holds_message(0, [(g,) for g in gears]))
            controller.step()

        assert _usable(ranks[0]) == _usable(ranks[1]) == frozenset()
        report(ranks[0], 8, 16, 32)
        assert _usable(ranks[0]) == frozenset()  # rank 1 has not reported: nothing is usable
        report(ranks[1], 16, 32, 64)
        assert _usable(ranks[0]) == _usable(ranks[1]) == {(16,), (32,)}
        report(ranks[1], 32)  # rank 1 released 16 and 64
        assert _usable(ranks[0]) == _usable(ranks[1]) == {(32,)}
        restarted = Worker(namespace, 1, clock)  # rank 1 restarts in another slot (a process
        ranks[1].close()  # of its own: it holds nothing until it reports)
        ranks[1] = restarted
        clock.advance(1.0)
        controller.step()
        _register(ranks[1], Group("tp", 1, 2), dims, controller)
        assert _usable(ranks[0]) == frozenset()
        report(ranks[1], 32, 64)
        assert _usable(ranks[0]) == _usable(ranks[1]) == {(32,)}
    finally:
        for w in ranks:
            w.close()
        controller.close()


def test_status_names_each_group_its_ranks_and_the_missing_one(namespace: str,
                                                               tmp_path: Path) -> None:
    clock = FakeClock(0.0)
    controller = Controller.open(ControllerConfig(namespace=namespace, state_dir=str(tmp_path)),
                                 PolicyConfig(), clock=clock)
    rank1 = Worker(namespace, 1, clock)
    try:
        _register(rank1, Group("tp", 1, 2), {"B": policy_dims(_trace(3), "adaptive")[
            "BATCHSIZE"]}, controller)
        (entry,) = controller.status_document(clock.now())["groups"]
        assert entry == {"group": "tp", "profile": "trace", "size": 2,
                         "ranks": [[1, rank1.slot, entry["ranks"][0][2], 1, True]],
                         "missing": [0], "recorder": 1, "usable": 0, "lacking": []}
    finally:
        rank1.close()
        controller.close()
