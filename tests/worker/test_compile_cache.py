"""The namespace's compile cache on the node: made private and checked, Inductor pointed at it
(unless told otherwise), and a per-shape lock so that one process compiles a shape while the
others wait, then load it."""

from __future__ import annotations

import fcntl
import logging
import os
import stat
from pathlib import Path

import pytest
import torch
from fakeclock import FakeClock

import gearshift as gs
from gearshift.graphs import Transform
from gearshift.graphs.backends import CpuBackend
from gearshift.graphs.pool import GraphResourcePool
from gearshift.graphs.torchcompile import CompiledRunner
from gearshift.worker import compile_cache


def test_the_cache_is_made_private_and_inductor_pointed_at_it(
    namespace: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    locks = compile_cache.prepare(namespace)
    root = tmp_path / "gearshift" / namespace
    assert locks == root / "locks" and os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(
        root / "inductor")
    for d in (root.parent, root, root / "inductor", locks):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/elsewhere")  # the environment's is kept
    compile_cache.prepare(namespace)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/elsewhere"


def test_the_default_that_importing_inductor_writes_in_the_environment_is_replaced(
    namespace: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    # what `import torch._inductor.config` leaves there when nothing named a cache
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", os.path.abspath(default_cache_dir()))
    compile_cache.prepare(namespace)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(
        tmp_path / "gearshift" / namespace / "inductor")


def test_a_cache_others_may_write_or_a_link_is_refused(
    namespace: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    root = tmp_path / "gearshift" / namespace
    root.mkdir(parents=True)
    root.chmod(0o777)
    with pytest.raises(gs.StateError, match="writable by no one else"):
        compile_cache.prepare(namespace)
    root.rmdir()
    (tmp_path / "target").mkdir(mode=0o700)
    root.symlink_to(tmp_path / "target")
    with pytest.raises(gs.StateError, match="without following a link"):
        compile_cache.prepare(namespace)


def fn(x: torch.Tensor) -> torch.Tensor:
    return x * 3


class Releasing(FakeClock):
    """Virtual time whose first sleep lets go of `fd`'s lock (another process finishing)."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self.fd: int | None = fd

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def make(lock_dir: Path, clock: FakeClock, wait: float = 600.0) -> CompiledRunner:
    dims = {"SEQLEN": gs.Dim(gears=[4], max=8)}
    transform = Transform(fn, dims, inputs={"x": ("S", None)}, outputs=("S", None))
    return CompiledRunner(transform, {"x": torch.zeros(1, 2)},
                          pool=GraphResourcePool(CpuBackend()), clock=clock,
                          compile_backend="eager", lock_dir=lock_dir, lock_wait=wait)


def held(lock_dir: Path) -> int:
    """The lock of the one shape compiled so far, held as by a process compiling it now (its
    marker removed: not compiled yet)."""
    (lock,) = lock_dir.glob("*.lock")
    lock.with_suffix(".done").unlink(missing_ok=True)
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_a_shape_another_process_compiles_is_waited_for_then_loaded_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert make(tmp_path, FakeClock()).capture([{"SEQLEN": 4}]) == 1
    assert len(list(tmp_path.glob("*.done"))) == 1  # compiled: marked
    clock = Releasing(held(tmp_path))
    second = make(tmp_path, clock)
    assert second.capture([{"SEQLEN": 4}]) == 1
    assert second.compiles[0].waited == pytest.approx(0.05) and clock.fd is None
    assert len(list(tmp_path.glob("*.done"))) == 1  # the second compiled it: marked again
    fd = os.open(next(tmp_path.glob("*.lock")), os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a process holds it, but it is compiled:
    try:
        third = make(tmp_path, FakeClock(), wait=1.0)
        assert third.capture([{"SEQLEN": 4}]) == 1
        assert third.compiles[0].waited == 0  # loaded beside the others, no wait
    finally:
        os.close(fd)
    fd = held(tmp_path)  # one that never finishes: waited for lock_wait, then compiled here
    try:
        fourth = make(tmp_path, FakeClock(), wait=1.0)
        with caplog.at_level(logging.WARNING, "gearshift.graphs.torchcompile"):
            assert fourth.capture([{"SEQLEN": 4}]) == 1
        assert fourth.compiles[0].waited >= 1.0 and "compiling it here too" in caplog.text
    finally:
        os.close(fd)
