"""An embedded controller's process ended by SIGTERM leaves nothing behind (its segments, its
temporary state directory); one killed harder leaves what `gearshift cleanup` removes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from controller.clirun import gs
from gearshift.controller.embedded import remove_scratch, scratch_prefix
from gearshift.controller.statefile import StateLock

WORKER = """
import sys, time
import gearshift as gs
client = gs.connect(sys.argv[1], embedded=True)
client.profile("p", {"SEQLEN": gs.Dim(max=64)}).route(SEQLEN=3)
print("ready", flush=True)
for _ in range(600):  # short sleeps: a SIGTERM taken between the check for signals before a
    time.sleep(0.1)  # call and the call's sleep is handled when that sleep ends (CPython)
"""

HOLDER = """
import sys, time
from pathlib import Path
from gearshift.controller.statefile import StateLock
lock = StateLock.acquire(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(60)
"""


def _shm(namespace: str) -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(f"gearshift.{namespace}."))


def _scratch(root: Path, namespace: str) -> list[Path]:
    return sorted(root.glob(f"{scratch_prefix(namespace)}*"))


def test_sigterm_to_an_embedded_process_leaves_no_segments_and_no_state_dir(
    namespace: str, tmp_path: Path
) -> None:
    """Before: 5 /dev/shm entries and the temporary state directory were left."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    child = subprocess.Popen([sys.executable, "-c", WORKER, namespace], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        assert _shm(namespace) and _scratch(tmp_path, namespace)
        child.send_signal(signal.SIGTERM)
        code = child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert code == 128 + signal.SIGTERM, child.stderr.read() if child.stderr else ""
    assert _shm(namespace) == [] and _scratch(tmp_path, namespace) == []


def test_cleanup_removes_the_state_dirs_dead_embedded_controllers_left(
    namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead, live = (tmp_path / f"{scratch_prefix(namespace)}{s}" for s in ("dead_123", "live_456"))
    other = tmp_path / f"{scratch_prefix(namespace)}x-abcdefgh"  # namespace "<ns>-x"'s
    for d in (dead, live, other):
        d.mkdir(mode=0o700)
        (d / "gearshift-state.msgpack").write_bytes(b"")
    StateLock.acquire(dead).release()  # what a SIGKILLed controller leaves: a free lock
    holder = subprocess.Popen(  # a live embedded controller's (lockf: another process's)
        [sys.executable, "-c", HOLDER, str(live)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        result = gs("cleanup", "-n", namespace)
        assert result.exit_code == 0, result.output
        assert str(dead) in result.output and not dead.exists()
        assert live.exists() and other.exists()
    finally:
        holder.kill()
        holder.wait()
    assert str(live) in "\n".join(remove_scratch(namespace)) and not live.exists()
