"""`gearshift serve` as a Kubernetes sidecar runs it: in a pid namespace of its own, sharing
/dev/shm with its workers (no shareProcessNamespace); and the signals a terminal sends."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fakeclock import FakeClock
from isolated import Isolated, needs_pidns, needs_timens

import gearshift as gs
from gearshift.clikit import EXIT_CONFLICT
from gearshift.clock import MonotonicClock
from gearshift.controller import statefile, status, view
from gearshift.controller.controller import Controller
from gearshift.errors import NamespaceLost
from gearshift.shm import Registry, SlotState, cleanup, control, lease, names, segment

WAIT = 20.0


def _serve_argv(namespace: str, state: Path) -> list[str]:
    return [sys.executable, "-m", "gearshift", "serve", "-n", namespace, "--state-dir",
            str(state), "--set", "scan_interval_seconds=0.05"]


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.fixture
def leftovers(namespace: str) -> Iterator[None]:
    yield
    for entry in os.listdir(segment.SHM_DIR):
        if namespace in entry:
            os.unlink(os.path.join(segment.SHM_DIR, entry))


def _worker(namespace: str, stop: threading.Event) -> tuple[Registry, int, threading.Thread]:
    """A raw worker in this process: a slot claimed, beaten every 0.1 s until `stop`."""
    registry = Registry.attach(namespace)
    slot = registry.claim_slot(0)

    def beat() -> None:
        while not stop.is_set():
            registry.beat(slot, time.monotonic_ns(), 0, 0)
            stop.wait(0.1)

    thread = threading.Thread(target=beat)
    thread.start()
    return registry, slot, thread


@needs_pidns
def test_serve_in_its_own_pid_namespace_stops_leaving_the_namespace_to_a_live_worker(
    namespace: str, tmp_path: Path, leftovers: None
) -> None:
    """Fault 2: at a graceful stop it judged the worker dead (not in its /proc) and removed
    the namespace under it."""
    serve = Isolated("", argv=_serve_argv(namespace, tmp_path))
    stop = threading.Event()
    try:
        _until(lambda: segment.exists(names.status(namespace)), "serve to start")
        shown = view.gather(namespace, MonotonicClock())
        assert shown["controller"]["alive"] and shown["controller"]["foreign"]
        assert "in another pid namespace" in view.render(shown)
        registry, slot, beating = _worker(namespace, stop)
        time.sleep(1.0)  # a few of its scans: the worker is watched, never reclaimed
        serve.signal(signal.SIGTERM)
        assert serve.wait() == 0, serve.stderr
        assert segment.exists(names.control(namespace)), serve.stderr
        assert not registry.segment.displaced()
        info = registry.slots()[slot]
        assert info.state == SlotState.ACTIVE and info.alive and registry.holds(slot)
        assert registry.controller().pid == 0  # released
        stop.set()
        beating.join()
        registry.release_slot(slot)
        registry.close()
        cleanup(namespace)
    finally:
        stop.set()
        serve.kill()


@needs_pidns
def test_a_second_serve_from_another_pid_namespace_is_refused(
    namespace: str, tmp_path: Path, leftovers: None
) -> None:
    """Fault 3: both ran, the controller word flipping between them."""
    first = subprocess.Popen(_serve_argv(namespace, tmp_path / "a"), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        _until(lambda: segment.exists(names.status(namespace)), "the first serve to start")
        second = Isolated("", argv=_serve_argv(namespace, tmp_path / "b"))
        try:
            assert second.wait() == EXIT_CONFLICT
            assert "owned by a live controller" in second.stderr, second.stderr
        finally:
            second.kill()
        registry = Registry.attach(namespace)
        try:
            owner = registry.controller()
            assert owner.alive and owner.pid == first.pid
        finally:
            registry.close()
        first.send_signal(signal.SIGTERM)
        assert first.wait(WAIT) == 0
    finally:
        first.kill()
        first.wait(WAIT)
        first.stderr.close()


def test_sighup_stops_serve_like_sigterm(namespace: str, tmp_path: Path, leftovers: None) -> None:
    """A terminal closing under `serve` (tmux, ssh) killed it with 129: no final save, its
    identity left behind."""
    proc = subprocess.Popen(_serve_argv(namespace, tmp_path), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        _until(lambda: segment.exists(names.status(namespace)), "serve to start")
        proc.send_signal(signal.SIGHUP)
        assert proc.wait(WAIT) == 0, proc.stderr.read()
        assert not segment.exists(names.control(namespace))  # no worker: removed at the stop
        assert list(tmp_path.rglob(statefile.STATE_FILE))  # the final save
    finally:
        proc.kill()
        proc.wait(WAIT)
        proc.stderr.close()


@needs_timens
def test_a_controller_whose_clock_is_not_its_workers_folds_their_events_in_its_window(
    namespace: str, tmp_path: Path, leftovers: None
) -> None:
    """Fault 8: under a time namespace (CRIU, sandboxes) every event was counted folded, dated
    a day before the controller's window, and none reached it; status said "-100000 s ago"."""
    serve = Isolated("", time_offset=100_000, argv=_serve_argv(namespace, tmp_path))
    try:
        _until(lambda: segment.exists(names.status(namespace)), "serve to start")
        with gs.connect(namespace) as client:
            prof = client.profile("prefill", {"SEQLEN": gs.Dim(max=4096)})
            _until(lambda: prof.registered, "the registration")
            time.sleep(1.5)  # a heartbeat or two: the controller estimates this clock's offset
            for i in range(200):
                prof.route(SEQLEN=1 + i)

            def folded() -> dict | None:
                doc = status.read(namespace)
                return doc if doc and doc["events"]["folded"] >= 200 else None

            _until(lambda: folded() is not None, "the events folded")
            doc = folded()
            assert doc["events"].get("misdated", 0) == 0 and doc["events"]["invalid"] == 0
            (dim,) = doc["devices"][0]["profiles"][0]["dims"]
            assert dim["samples"] > 100  # in the window, not decayed to nothing
            shown = view.gather(namespace, MonotonicClock())["controller"]
            assert shown["heartbeat_age_seconds"] is None  # its clock is not ours: not shown
        serve.signal(signal.SIGTERM)
        assert serve.wait() == 0, serve.stderr
    finally:
        serve.kill()


def test_a_worker_whose_ring_layout_the_controller_cannot_read_is_told_so_in_its_log(
    controller: Controller, caplog: pytest.LogCaptureFixture
) -> None:
    """It was told it was registered while every event it wrote was dropped, with no word."""
    with gs.connect(controller.config.namespace, background=False,
                    register_timeout=0) as client:
        client.profile("prefill", {"SEQLEN": gs.Dim(max=4096)})
        client.ring.segment.words[1] = 99  # its ring's layout word: another version's
        with caplog.at_level(logging.ERROR):
            for _ in range(3):
                controller.step()
                client._tick()
        refusals = [r for r in caplog.records if r.name == "gearshift.worker.registration"]
        assert refusals and "controller refuses this worker" in refusals[0].getMessage()
        assert "layout" in refusals[0].getMessage()


def _usurp(controller: Controller) -> memoryview:
    """The controller word rewritten to name a process of another realm; its words."""
    words = controller.registry.segment.words
    words[control.CONTROLLER_REALM // 8] = 12345  # not this process's pid and time namespaces
    words[control.CONTROLLER // 8] = 99 << 22 | 4242
    return words


def test_a_controller_whose_word_another_beating_controller_took_stops(
    controller: Controller, clock: FakeClock
) -> None:
    words = _usurp(controller)
    controller.step()  # watched: not yet known to be alive
    words[control.CONTROLLER_BEATS // 8] += 1  # it beats: another controller took over
    clock.advance(0.01)
    with pytest.raises(NamespaceLost, match="another controller took the namespace over"):
        controller.step()
    words[control.CONTROLLER // 8] = 0  # (the fixture's close releases nothing of its own)


def test_a_controller_word_a_buggy_write_took_is_claimed_back_after_the_lease(
    controller: Controller, clock: FakeClock
) -> None:
    _usurp(controller)
    controller.step()
    assert not controller.registry.owns_controller()
    for _ in range(int(lease.LEASE) + 1):  # it never beats
        clock.advance(1.0)
        controller.step()
    assert controller.registry.owns_controller()
