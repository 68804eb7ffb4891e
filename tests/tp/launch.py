"""Starting the harness's rank processes and a controller, bounded in time, and cleaning up."""

from __future__ import annotations

import queue
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from pathlib import Path

from gearshift.shm import cleanup, names, segment

START_SECONDS = 20.0  # the controller's start
QUIET_SECONDS = 0.2


@dataclass
class Outcome:
    """What the ranks reported, their exit codes (None: killed at the deadline) and whether
    any had to be killed (a hang)."""

    reports: list[tuple] = field(default_factory=list)
    exitcodes: list[int | None] = field(default_factory=list)
    hung: bool = False

    def of(self, kind: str) -> list[tuple]:
        return [r for r in self.reports if r[0] == kind]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Ranks:
    """The rank processes of one run: `procs[r]` is rank r's current process."""

    def __init__(self, mp: BaseContext, target: Callable[..., None], size: int, port: int,
                 results) -> None:
        self.mp, self.target, self.port, self.results = mp, target, port, results
        self.procs: list[BaseProcess] = [None] * size  # type: ignore[list-item]

    def start(self, rank: int, *args: object) -> None:
        """Start `target(rank, size, port, *args, results)` as rank `rank`'s process."""
        self.procs[rank] = self.mp.Process(
            target=self.target, args=(rank, len(self.procs), self.port, *args, self.results),
            daemon=True)
        self.procs[rank].start()

    def kill(self, rank: int) -> None:
        """SIGKILL rank `rank`'s process and reap it. It must be idle (waiting to be killed):
        one killed while its queue's feeder thread holds the queue's lock would leave every
        other rank's reports stuck behind it, so it is given QUIET_SECONDS to let go first."""
        time.sleep(QUIET_SECONDS)
        self.procs[rank].kill()
        self.procs[rank].join(10)


def run_ranks(mp: BaseContext, target: Callable[..., None], size: int, args: tuple,
              deadline: float, react: Callable[[tuple, Ranks], object] | None = None
              ) -> Outcome:
    """`target(rank, size, port, *args, results)` in `size` processes; waits up to `deadline`
    seconds for all to exit, kills those left (a hang) and returns what they said (each
    report passed to `react` as it comes, with the `Ranks`, which may kill and replace
    one; the exit codes are those of each rank's last process)."""
    results = mp.Queue()
    ranks = Ranks(mp, target, size, free_port(), results)
    for r in range(size):
        ranks.start(r, *args)
    out = Outcome()
    end = time.monotonic() + deadline
    while any(p.is_alive() for p in ranks.procs) and time.monotonic() < end:
        _take(results, out, 0.05, react, ranks)
    for p in ranks.procs:
        if p.is_alive():
            out.hung = True
            p.kill()
        p.join(10)
    _take(results, out, 0.2)
    out.exitcodes = [None if p.exitcode is not None and p.exitcode < 0 and out.hung
                     else p.exitcode for p in ranks.procs]
    results.close()
    return out


def _take(results, out: Outcome, wait: float,
          react: Callable[[tuple, Ranks], object] | None = None,
          ranks: Ranks | None = None) -> None:
    try:
        while True:
            out.reports.append(results.get(timeout=wait))
            if react is not None:
                react(out.reports[-1], ranks)
            wait = 0.0
    except queue.Empty:
        pass


@contextmanager
def controller(namespace: str, state: Path, *settings: str
               ) -> Iterator[Callable[[], subprocess.Popen]]:
    """`gearshift serve` on `namespace` with `settings` (KEY=VALUE), started; yields
    `restart()`, which kills the running one (SIGKILL, as a crash) and starts another on the
    same state dir. The last is stopped, and every segment of the namespace removed, at the
    end. Its log goes to `state`/controller.log (a pipe nobody reads would fill and stall it)."""
    cmd = [sys.executable, "-m", "gearshift", "serve", "-n", namespace, "--state-dir",
           str(state), "--set", "scan_interval_seconds=0.05"]
    for s in settings:
        cmd += ["--set", s]
    log = (state / "controller.log").open("a")
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)]

    def restart() -> subprocess.Popen:
        procs[-1].kill()
        procs[-1].wait()
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log))
        return procs[-1]

    try:
        end = time.monotonic() + START_SECONDS
        while not segment.exists(names.status(namespace)):
            assert procs[0].poll() is None, (state / "controller.log").read_text()
            assert time.monotonic() < end, "the controller did not start"
            time.sleep(0.02)
        yield restart
    finally:
        subprocess.run([sys.executable, "-m", "gearshift", "stop", "-n", namespace],
                       capture_output=True, timeout=START_SECONDS)
        for proc in procs:
            try:
                proc.wait(START_SECONDS)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        cleanup(namespace)


def lockstep(out: Outcome, size: int, steps: int | None, tolerance: float) -> list[dict]:
    """Assert that `size` grouped ranks served all `steps` (None: the same count each) with no
    hang, error or step whose gears differed, every output within `tolerance` of the
    unsharded block; returns each rank's stats, in rank order, with its "steps"."""
    assert not out.hung and out.exitcodes == [0] * size and not out.of("error"), out.reports
    assert not out.of("step"), out.of("step")
    done = sorted(out.of("done"), key=lambda d: d[1])
    assert [d[1] for d in done] == list(range(size)), out.reports
    steps = done[0][2] if steps is None else steps
    for _, _, served, worst, differed, _ in done:
        assert served == steps and differed == 0 and worst <= tolerance, done
    return [{**d[5], "steps": d[2]} for d in done]
