"""Shared fixtures: unique shared-memory namespaces, bounded child processes, a private state
directory, and session-wide checks that nothing is left in /dev/shm or the user's state.

Torch's kernels run on one thread in the suite and in every process it starts (OMP_NUM_THREADS,
set here before anything imports torch, unless already set): the tests' tensors are small, and
on a 2-core machine shared with child processes an OpenMP team waits on a descheduled thread."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import subprocess
from collections.abc import Callable, Iterator
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
PREFIX = f"gstest{os.getpid()}x"
JOIN_TIMEOUT = 30.0
_counter = itertools.count()
USER_STATE = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")


def _leaked() -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if PREFIX in n)


@pytest.fixture
def namespace() -> str:
    """A namespace no other test uses."""
    return f"{PREFIX}{next(_counter)}"


@pytest.fixture(scope="session")
def mp() -> BaseContext:
    """The context of child processes: a forkserver with the child bodies preloaded."""
    ctx = multiprocessing.get_context("forkserver")
    # torch and gearshift's worker side for tests/tp's rank processes (each would import them,
    # seconds apiece); the test folders' modules load only where the forkserver's sys.path has
    # them (Python 3.11 never gives it the parent's: there they load in each child)
    ctx.set_forkserver_preload(["shm.procs", "worker.fake_controller", "tp.ranks", "torch",
                                "torch.distributed", "gearshift.graphs.adaptive",
                                "gearshift.worker.group"])
    return ctx


@pytest.fixture
def spawn(mp: BaseContext) -> Iterator[Callable[..., BaseProcess]]:
    """Start `target(*args)` in a child; every child is joined (or killed) when the test ends."""
    children: list[BaseProcess] = []

    def start(target: Callable[..., None], *args: object) -> BaseProcess:
        child = mp.Process(target=target, args=args, daemon=True)
        child.start()
        children.append(child)
        return child

    yield start
    for child in children:
        child.join(JOIN_TIMEOUT)
        if child.is_alive():
            child.kill()
            child.join()
    assert all(child.exitcode is not None for child in children)


@pytest.fixture(scope="session", autouse=True)
def no_leaked_segments() -> Iterator[None]:
    yield
    leaked = _leaked()
    for name in leaked:
        os.unlink(os.path.join("/dev/shm", name))
    assert not leaked, f"the test run left shared-memory segments behind: {leaked}"


def _files(root: Path) -> set[Path]:
    return set(root.rglob("*")) if root.is_dir() else set()


@pytest.fixture(scope="session", autouse=True)
def private_state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """XDG_STATE_HOME, for this process and every child it starts, is a temporary directory:
    a controller with the default state directory writes there, never in the user's."""
    before = _files(USER_STATE / "gearshift")
    home = tmp_path_factory.mktemp("state-home")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("XDG_STATE_HOME", str(home))
        yield home
    added = sorted(map(str, _files(USER_STATE / "gearshift") - before))
    assert not added, f"the test run wrote under the user's state directory: {added}"



@pytest.fixture(scope="session")
def tiny_shm() -> Callable[..., subprocess.CompletedProcess[str] | None]:
    """`run(args, size, timeout=120)`: run `args` in a private mount namespace whose /dev/shm
    is a fresh tmpfs of `size` bytes (`faults.private_shm`); skipped where none can be made."""
    from gearshift.tools.stress.faults import private_shm

    if private_shm(["true"], 64 << 10) is None:
        pytest.skip("no private mount namespace with a tmpfs on /dev/shm can be made here")
    return private_shm


@pytest.fixture(scope="session")
def inductor_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One Inductor cache directory for the session's compiles (TORCHINDUCTOR_CACHE_DIR, for
    this process and its children): a shape compiled by one test loads from it in the next."""
    cache = tmp_path_factory.mktemp("inductor")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))
        yield cache


@pytest.fixture(scope="session", autouse=True)
def private_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """XDG_CACHE_HOME (where `gs.compile` keeps a namespace's compile cache) is a temporary
    directory for the session and its children."""
    home = tmp_path_factory.mktemp("cache-home")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("XDG_CACHE_HOME", str(home))
        yield home
