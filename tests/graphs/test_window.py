"""The capture window (`graphs.window.CaptureGuard`): recordings are exclusive, shared
sections run together and nest on a thread, and neither side starves the other."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable

from gearshift.graphs.window import CaptureGuard

WAIT = 5.0  # seconds a thread is given to get where a test needs it (bounds a failure only)


def started(target: Callable[[], None]) -> threading.Thread:
    t = threading.Thread(target=target, daemon=True)
    t.start()
    return t


def until(cond: Callable[[], bool]) -> None:
    end = time.monotonic() + WAIT
    while not cond():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


def test_two_recordings_never_overlap() -> None:
    guard = CaptureGuard()
    inside, release, second = threading.Event(), threading.Event(), threading.Event()

    def first() -> None:
        with guard.exclusive():
            inside.set()
            release.wait(WAIT)

    def other() -> None:
        with guard.exclusive():
            second.set()

    a = started(first)
    assert inside.wait(WAIT)
    b = started(other)
    assert not second.wait(0.2)  # waits for the first recording to end
    release.set()
    assert second.wait(WAIT)
    a.join(WAIT), b.join(WAIT)


def test_a_recording_waits_for_shared_sections_and_new_ones_wait_for_it() -> None:
    guard = CaptureGuard()
    recorded, late, nested = threading.Event(), threading.Event(), threading.Event()

    def record() -> None:
        with guard.exclusive():
            recorded.set()

    def shared() -> None:
        with guard.shared():
            late.set()

    def holder() -> None:
        with guard.shared():
            r = started(record)
            s = started(shared)
            until(lambda: guard.blocked == 1)  # a new section waits behind the recording
            assert not recorded.is_set() and not late.is_set()
            with guard.shared():  # nested on this thread: runs, though a recording waits
                nested.set()
        r.join(WAIT), s.join(WAIT)

    h = started(holder)
    assert nested.wait(WAIT), "a nested shared section waited for the recording"
    assert recorded.wait(WAIT) and late.wait(WAIT)
    h.join(WAIT)
    assert guard.blocked == 0


def test_a_recording_inside_a_shared_section_is_refused_not_deadlocked() -> None:
    guard = CaptureGuard()
    refused: list[BaseException] = []

    def nested() -> None:
        with guard.shared():
            try:
                with guard.exclusive():
                    pass
            except RuntimeError as e:
                refused.append(e)

    started(nested).join(WAIT)
    assert refused and "wait for itself" in str(refused[0])
    with guard.exclusive():  # the section ended: the guard is free
        pass


class Order:
    """A stand-in for `workspaces.Order`: counts its blocks, or fails to enter one."""

    def __init__(self, fail: bool = False) -> None:
        self.fail, self.entered, self.left = fail, 0, 0

    def inside(self) -> Order:
        return self

    def __enter__(self) -> None:
        if self.fail:
            raise RuntimeError("no stream")
        self.entered += 1

    def __exit__(self, *exc: object) -> None:
        self.left += 1


def test_a_holding_section_is_shared_then_locked_then_ordered_and_left_whole() -> None:
    """A runner's replay section (`holding`): a recording waits for it, its lock is held and
    its order's block open inside it, and all three are left after it, by a raise too."""
    guard, lock, order = CaptureGuard(), threading.Lock(), Order()
    section = guard.holding(lock, order)
    recorded = threading.Event()

    def record() -> None:
        with guard.exclusive():
            recorded.set()

    with section:
        assert lock.locked() and (order.entered, order.left) == (1, 0)
        r = started(record)
        assert not recorded.wait(0.2)  # the recording waits for the section
        with guard.shared():  # nests in it on this thread
            pass
    assert recorded.wait(WAIT) and not lock.locked() and order.left == 1
    r.join(WAIT)
    try:
        with section:
            raise KeyError("fn failed")
    except KeyError:
        pass
    assert not lock.locked() and order.left == 2
    with guard.exclusive():  # the window is free
        pass


def test_a_holding_section_whose_order_fails_leaves_nothing_held() -> None:
    guard, lock = CaptureGuard(), threading.Lock()
    try:
        with guard.holding(lock, Order(fail=True)):
            raise AssertionError("entered")  # pragma: no cover
    except RuntimeError as e:
        assert "no stream" in str(e)
    assert not lock.locked() and not guard._holders
    with guard.exclusive():  # neither the window nor the lock is left held
        pass
    with guard.holding(lock):  # no order: the lock alone, after the window
        assert lock.locked()
    assert not lock.locked()


def test_recordings_and_shared_sections_never_overlap_under_thread_switches() -> None:
    """The lock-free common case (a thread's id added to `_holders`, then the flags read)
    against recordings, with the interpreter switching threads as often as it can: no
    recording ever sees a shared section underway, nor a section a recording."""
    guard = CaptureGuard()
    state = {"shared": 0, "recording": False, "sections": 0, "recordings": 0}
    count = threading.Lock()
    bad: list[str] = []
    stop = threading.Event()

    def sections() -> None:
        while not stop.is_set():
            with guard.shared():
                with count:
                    state["shared"] += 1
                    state["sections"] += 1
                    if state["recording"]:
                        bad.append("a section inside a recording")
                with guard.shared():  # nested, as a user's outside_capture() around a run
                    pass
                with count:
                    state["shared"] -= 1

    def recordings() -> None:
        while not stop.is_set():
            with guard.exclusive():
                with count:
                    state["recording"] = True
                    state["recordings"] += 1
                    if state["shared"]:
                        bad.append("a recording while a section ran")
                time.sleep(0)
                with count:
                    state["recording"] = False

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [started(sections) for _ in range(3)] + [started(recordings)]
        time.sleep(0.5)
        stop.set()
        for t in threads:
            t.join(WAIT)
    finally:
        sys.setswitchinterval(interval)
    assert not bad, bad[:3]
    assert state["sections"] > 10 and state["recordings"] > 10
    assert not guard._holders and guard.blocked == 0 and not guard._waiting
