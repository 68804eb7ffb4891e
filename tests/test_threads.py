"""gearshift's background threads block the process's asynchronous signals (`gearshift.threads`),
so that the kernel delivers `kill PID`'s SIGTERM to the main thread, whose Python handler then
runs at once, instead of to a helper thread, where it would wait for the main thread's blocking
call to end."""

from __future__ import annotations

import signal
import threading
from pathlib import Path

import gearshift as gs
from gearshift import threads


def _blocked(thread: threading.Thread) -> set[int]:
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    mask = int(next(line.split()[1] for line in status.splitlines()
                    if line.startswith("SigBlk:")), 16)
    return {s for s in range(1, 65) if mask >> (s - 1) & 1}


def test_a_thread_started_here_blocks_the_async_signals_and_the_starter_keeps_its_mask() -> None:
    before = signal.pthread_sigmask(signal.SIG_BLOCK, ())
    done, seen = threading.Event(), []
    thread = threading.Thread(target=lambda: done.wait(5) and None)
    threads.start(thread)
    try:
        seen = _blocked(thread)
    finally:
        done.set()
        thread.join(5)
    assert set(threads.ASYNC) <= seen
    assert signal.pthread_sigmask(signal.SIG_BLOCK, ()) == before


def test_every_thread_of_an_embedded_client_blocks_sigterm(namespace: str) -> None:
    """Before: the controller, lease and swap threads took SIGTERM as readily as the main
    thread, which then slept on through a blocking call."""
    with gs.connect(namespace, embedded=True) as client:
        client.profile("p", {"SEQLEN": gs.Dim(max=64)}).route(SEQLEN=3)
        lasting = ("gearshift-controller", "gearshift-lease", "gearshift-swap")
        ours = [t for t in threading.enumerate() if t.name in lasting]
        assert sorted(t.name for t in ours) == sorted(lasting)
        for t in ours:
            assert signal.SIGTERM in _blocked(t), t.name
