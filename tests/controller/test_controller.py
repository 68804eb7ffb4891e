"""The controller loop in virtual time: in-process workers (the shm primitives), `step()`."""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from fakeclock import FakeClock

from gearshift.controller import deciding, embedded, registrations, statefile
from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller
from gearshift.core.dims import Dim
from gearshift.errors import ProfileMismatch, StateError
from gearshift.shm import Registry, SlotState, names, ring, segment

from .workers import DIMS, POLICY, WAIT, Worker

LADDER = (1, 2, 4, 8, 16, 32, 64)


def _run(
    controller: Controller, clock: FakeClock, seconds: float, *workers: Worker, value: int = 40
) -> None:
    """`seconds` of virtual time in 0.1 s iterations, each worker putting one `value`."""
    for _ in range(round(seconds * 10)):
        clock.advance(0.1)
        for w in workers:
            w.put(0, value)
        controller.step()


def _shm(namespace: str) -> list[str]:
    return sorted(n for n in os.listdir(segment.SHM_DIR) if f".{namespace}." in n)


def test_registration_is_answered_and_published(controller: Controller, worker) -> None:
    w = worker()
    reply = w.register(3, "decode", serve=controller.step)
    assert reply == {"op": "registered", "profile": 3, "version": 1}
    assert w.snapshot()[0] == 1 and w.gears("decode") == {"B": LADDER}
    assert controller.devices[0].profiles["decode"].dims == DIMS


def test_a_name_must_match_on_its_device_only(controller: Controller, worker) -> None:
    first, second, other_device = worker(0), worker(0), worker(1)
    first.register(0, "decode", serve=controller.step)
    dims = {"B": Dim(max=128)}
    with pytest.raises(ProfileMismatch, match=f"registered by pid {os.getpid()}"):
        second.register(0, "decode", dims, serve=controller.step)
    assert other_device.register(0, "decode", dims, serve=controller.step)["version"] == 1


def test_events_flow_into_decisions_and_snapshots_advance(
    controller: Controller, worker, clock: FakeClock
) -> None:
    w = worker()
    w.register(0, "decode", serve=controller.step)
    _run(controller, clock, 12.0, w)
    version, payload = w.snapshot()
    gears = payload["profiles"]["decode"]["gears"]["B"]
    assert version > 1 and 40 in gears and 32 not in gears  # added at the median, unused evicted
    reasons = [c[3] for c in payload["profiles"]["decode"]["changes"]]
    assert controller.counts["folded"] == 120 and controller.rounds["count"] >= 2
    controller.saver.wait()  # saves are written off the loop: the one in flight, if any
    saved = statefile.load(controller.config.state_path, clock.now(), POLICY)
    assert saved[0].version == version
    assert list(saved[0].profiles["decode"].gear_lists()["B"]) == gears
    doc = controller.status_document(clock.now())
    dim = doc["devices"][0]["profiles"][0]["dims"][0]
    assert dim["samples"] == dim["history_samples"] == 120 and dim["gears"] == gears
    assert 0 <= dim["padding"] < 0.4
    assert all(isinstance(r, str) and r for r in reasons)


def test_memory_pressure_runs_a_round_before_the_interval(
    controller: Controller, worker, clock: FakeClock
) -> None:
    a, b = worker(), worker()
    a.register(0, "decode", serve=controller.step)
    _run(controller, clock, 2.0)
    assert controller.rounds["count"] == 1  # the first round; the next is 10 s away
    a.ring.put_memory(round(clock.now() * 1e9), free=50, total=100)
    b.ring.put_memory(round(clock.now() * 1e9), free=5, total=100)
    _run(controller, clock, 1.5)
    assert controller.slots.memory_usage(0, clock.now()) == 0.95  # the highest fresh reading
    assert controller.rounds["count"] >= 2
    clock.advance(controller.config.memory_fresh_seconds + 1)
    assert controller.slots.memory_usage(0, clock.now()) is None


def test_propagation_lag_waits_for_every_live_worker(
    controller: Controller, worker, clock: FakeClock
) -> None:
    a, b = worker(), worker()
    a.register(0, "decode", serve=controller.step)
    b.register(0, "decode", serve=controller.step)
    assert a.register(1, "prefill", serve=controller.step)["version"] == 2  # a new version
    clock.advance(0.05)
    a.snapshot()
    controller.step()
    assert controller.status_document(clock.now())["devices"][0]["lag"]["count"] == 0
    clock.advance(0.05)
    b.snapshot()
    controller.step()
    lag = controller.status_document(clock.now())["devices"][0]["lag"]
    assert lag["count"] == 1 and lag["last_seconds"] == pytest.approx(0.1)


def test_restart_continues_versions_and_restores_gears_even_on_new_segments(
    config: ControllerConfig, clock: FakeClock
) -> None:
    with Controller.open(config, POLICY, clock=clock) as first:
        w = Worker(config.namespace, 0, clock)
        w.register(0, "decode", serve=first.step)
        _run(first, clock, 12.0, w)
        version, payload = w.snapshot()
        w.close()
    assert _shm(config.namespace) == []  # no live worker: the namespace went with it
    with Controller.open(config, POLICY, clock=clock):
        w = Worker(config.namespace, 0, clock)
        assert w.snapshot() == (
            version + 1,
            payload
            | {
                "profiles": {
                    "decode": {"gears": payload["profiles"]["decode"]["gears"], "changes": []}
                }
            },
        )
        w.close()


def test_takeover_keeps_the_segments_and_folds_what_the_rings_hold(
    config: ControllerConfig, clock: FakeClock
) -> None:
    with Controller.open(config, POLICY, clock=clock) as first:
        w = Worker(config.namespace, 0, clock)
        w.register(5, "decode", serve=first.step)
    # a live worker: the namespace stays, the worker keeps its snapshot
    assert names.control(config.namespace)[1:] in _shm(config.namespace)
    assert w.gears("decode") == {"B": LADDER}
    for _ in range(10):
        assert w.put(5, 40)  # recorded while no controller runs
    with Controller.open(config, POLICY, clock=clock) as second:
        second.step()
        assert second.counts["folded"] == 10 and second.counts["unknown"] == 0
        assert w.snapshot()[0] == 2  # restored devices are published once on start
        w.close()


def test_a_successor_folds_the_events_of_a_registration_answered_just_before_a_kill(
    config: ControllerConfig, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = Controller.open(config, POLICY, clock=clock)

    def killed(*args: Any) -> None:
        answer(*args)
        raise KeyboardInterrupt  # the controller dies right after answering, as by SIGKILL

    answer = registrations.post
    monkeypatch.setattr(registrations, "post", killed)
    w = Worker(config.namespace, 0, clock)
    with pytest.raises(KeyboardInterrupt):
        w.register(5, "decode", serve=first.step)
    for _ in range(10):
        assert w.put(5, 40)  # routed on the registration the dead controller answered
    with Controller.open(config, POLICY, clock=clock) as second:
        second.step()
        assert second.counts["folded"] == 10 and second.counts["unknown"] == 0
        w.close()


def test_dead_worker_is_drained_and_reclaimed(controller: Controller, clock: FakeClock) -> None:
    script = Path(__file__).with_name("workers.py")
    child = subprocess.Popen(
        [sys.executable, str(script), controller.config.namespace, "0", "100"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + WAIT
        while not select.select([child.stdout], [], [], 0.005)[0]:
            assert time.monotonic() < deadline and child.poll() is None, "worker not ready"
            controller.step()  # answers its registration
        slot = int(child.stdout.readline().split()[1])
    finally:
        child.kill()
        child.wait(WAIT)
        child.stdout.close()
    clock.advance(controller.config.scan_interval_seconds)
    controller.step()
    assert controller.counts["reclaimed_workers"] == 1 and controller.counts["folded"] == 100
    assert controller.counts["exited_workers"] == 0  # killed: it died, it did not exit
    assert slot not in controller.workers
    assert names.ring(controller.config.namespace, slot)[1:] not in _shm(
        controller.config.namespace
    )
    registry = Registry.attach(controller.config.namespace)
    try:
        assert registry.slots()[slot].state == SlotState.FREE
    finally:
        registry.close()


def test_unknown_and_invalid_events_are_counted(
    controller: Controller, worker, clock: FakeClock
) -> None:
    w = worker()
    w.register(0, "decode", serve=controller.step)
    for args in [(0, 40), (0, 0), (0, 65), (1, 8), (0, 4, 4)]:
        w.put(*args)
    controller.step()
    assert {k: controller.counts[k] for k in ("folded", "unknown", "invalid")} == {
        "folded": 1,
        "unknown": 1,
        "invalid": 3,
    }


def test_a_corrupt_ring_fails_alone_and_is_discarded_with_its_worker(
    controller: Controller, worker, clock: FakeClock
) -> None:
    bad, good = worker(), worker()
    for w in (bad, good):
        w.register(0, "decode", serve=controller.step)
    bad.ring.segment.words[ring.HEAD // 8] = 1 << 40  # head far beyond tail: inconsistent
    good.put(0, 40)
    controller.step()
    assert controller.counts["folded"] == 1 and controller.counts["errors"] == 1
    bad.close()
    clock.advance(controller.config.scan_interval_seconds)
    controller.step()
    assert controller.counts["exited_workers"] == 1  # it released its slot: no dead worker
    assert controller.counts["reclaimed_workers"] == 0
    assert names.ring(controller.config.namespace, bad.slot)[1:] not in _shm(
        controller.config.namespace
    )


def test_initial_gears_seed_new_profiles(
    config: ControllerConfig, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    seed = {0: {"decode": {"B": (8, 40, 64)}}, 3: {"prefill": {"B": (1, 999)}}}
    with Controller.open(config, POLICY, clock=clock, initial_gears=seed) as c:
        w = Worker(config.namespace, 1, clock)
        w.register(0, "decode", serve=c.step)  # another device: the first device's seed
        assert w.gears("decode") == {"B": (8, 40, 64)}
        with caplog.at_level(logging.WARNING):
            w.register(1, "prefill", serve=c.step)  # 999 is over the dim's max: ignored
        assert w.gears("prefill") == {"B": LADDER} and "ignored" in caplog.text
        w.close()


def test_corrupt_state_is_an_error_unless_asked_to_start_fresh(
    config: ControllerConfig, clock: FakeClock
) -> None:
    config.state_path.mkdir(parents=True)
    (config.state_path / statefile.STATE_FILE).write_bytes(b"\xc1garbage")
    with pytest.raises(StateError, match="corrupt"):
        Controller.open(config, POLICY, clock=clock)
    assert _shm(config.namespace) == []  # nothing left behind
    with Controller.open(config, POLICY, clock=clock, fresh_on_corrupt_state=True):
        pass
    assert (config.state_path / (statefile.STATE_FILE + ".corrupt")).read_bytes() == b"\xc1garbage"
    assert msgpack.unpackb((config.state_path / statefile.STATE_FILE).read_bytes())["devices"] == {}


def test_a_failing_round_is_logged_and_the_loop_goes_on(
    controller: Controller,
    worker,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("policy bug")

    monkeypatch.setattr(deciding, "decide_round", broken)
    w = worker()
    w.register(0, "decode", serve=controller.step)
    with caplog.at_level(logging.ERROR):
        _run(controller, clock, 2.5, w)  # checks at registration, ~1 s and ~2 s: no float edge
    assert controller.counts["errors"] == 3 and controller.counts["folded"] == 25
    assert len(caplog.records) == 1  # rate-limited


def test_a_failing_state_save_is_logged_and_the_loop_goes_on(
    controller: Controller, worker, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(*args: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(statefile, "write", full)  # every save: on the loop or off it
    w = worker()
    assert w.register(0, "decode", serve=controller.step)["version"] == 1
    _run(controller, clock, 12.0, w)
    assert 40 in w.gears("decode")["B"] and controller.counts["errors"] >= 2


def test_rounds_that_change_every_second_save_at_most_every_save_interval(
    config: ControllerConfig, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The state file is replaced at most once per `save_interval_seconds` (5 s) of rounds
    that change something, not after each of them."""
    saves, real = [], os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst, **fds: (saves.append(dst),
                                                                real(src, dst, **fds)))
    policy = dataclasses.replace(POLICY, update_interval_seconds=1.0)
    with Controller.open(config, policy, clock=clock) as controller:
        w = Worker(config.namespace, 0, clock)
        try:
            w.register(0, "decode", {"B": Dim(gears=[1], max=4096)}, serve=controller.step)
            saves.clear()
            changed = 0
            for second in range(32):  # every second, traffic over the largest gear: one added
                before = controller.rounds["count"]
                _run(controller, clock, 1.0, w, value=100 * (second + 1))
                changed += (controller.rounds["count"] > before
                            and any(controller.changes[0].values()))
            during = len(saves)
        finally:
            w.close()
    assert changed >= 24
    assert during <= 7  # 32 s at one save per 5 s (the default save_interval_seconds)

def test_embedded_controller_runs_the_same_loop_in_a_thread(config: ControllerConfig) -> None:
    running = embedded.start(config, POLICY)
    w = Worker(config.namespace, 0)
    assert w.register(0, "decode")["version"] == 1
    w.close()
    assert running.stop(WAIT)
    assert running.controller.status["embedded"] and _shm(config.namespace) == []


def _priced(w: Worker, controller: Controller, memory: int) -> Worker:
    """`w` with profile 0 registered, two of its gears measured (1 KiB a graph: its dim is
    priced), and a reading of `memory` bytes of device memory."""
    w.register(0, "decode", serve=controller.step)
    for gear in (8, 16):
        assert w.ring.write(1, *ring.measured(0, 1, 0, gear, 0.25, 1024, 1e-3))
    assert w.ring.put_memory(round(controller.clock.now() * 1e9), free=1, total=memory)
    return w


def test_the_bound_is_never_under_its_share_of_the_least_memory_a_worker_reports(
    controller: Controller, worker, clock: FakeClock
) -> None:
    _priced(worker(), controller, 10**9)
    other = worker()
    other.ring.put_memory(round(clock.now() * 1e9), free=1, total=10**15)  # overstated: not taken
    _run(controller, clock, 1.0)
    assert controller.slots.device_bytes(0) == 10**9
    device = controller.status_document(clock.now())["devices"][0]
    assert device["memory_bytes"] == 10**9
    held, bound = (device["graph_bytes"][k] for k in ("held", "bound"))
    assert 0 < held < 10**5 and bound == pytest.approx(0.005 * 10**9)
    clock.advance(controller.config.memory_fresh_seconds + 1)  # stale readings: still known
    _run(controller, clock, 0.2)
    assert controller.device_memory(0) == 10**9


def test_a_restarted_controller_bounds_the_restored_gears_by_the_memory_last_read(
    config: ControllerConfig, clock: FakeClock
) -> None:
    with Controller.open(config, POLICY, clock=clock) as first:
        w = _priced(Worker(config.namespace, 0, clock), first, 10**9)
        _run(first, clock, 1.0)
        assert first.device_memory(0) == 10**9
        w.close()
    with Controller.open(config, POLICY, clock=clock) as second:  # no worker has read it yet
        assert second.slots.device_bytes(0) is None and second.devices[0].memory_bytes == 10**9
        device = second.status_document(clock.now())["devices"][0]
        assert device["graph_bytes"]["bound"] == pytest.approx(0.005 * 10**9)


def test_an_idle_loop_waits_longer_and_the_first_event_brings_the_drain_interval_back(
        controller: Controller, worker, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = worker()
    w.register(0, "decode", serve=controller.step)
    busy, idle = (controller.config.drain_interval_seconds,
                  controller.config.idle_interval_seconds)
    waits: list[float] = []
    stop = threading.Event()

    def sleep(seconds: float) -> None:  # the loop's waits, recorded (virtual time)
        waits.append(seconds)
        clock.advance(max(seconds, 0.0))
        if len(waits) == 8:
            assert w.put(0, 40)  # the next iteration drains it
        if len(waits) == 10:
            w.close()  # released before the controller's close: it removes the namespace
            stop.set()

    monkeypatch.setattr(clock, "sleep", sleep)
    controller.run(stop)
    doubling = [min(busy * 2**k, idle) for k in range(1, 8)]  # while nothing comes in
    assert waits[:7] == pytest.approx(doubling) and doubling[-1] == idle
    assert max(waits) == idle and waits[7] == idle
    assert waits[8:] == [busy, 2 * busy]  # an event drained: the drain interval again
