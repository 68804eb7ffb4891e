"""The demo's worker processes as the demo process drives them: started, asked, ended.

Each worker is a spawned process (`worker.main`, which imports torch) with a pipe to this one.
A command goes to the workers and every reply is awaited until a deadline: a worker that fails,
dies or is late is a GearshiftError. The deadline is READY_TIMEOUT, plus `compile_allowance`
for a command that may compile gears (`--backend compile`): a bound always, scaled with the
compiles the command may run. A worker starts with SIGINT ignored (Ctrl-C is the demo
process's to handle); `end` asks every worker to exit, then terminates, then kills.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import time
from collections.abc import Callable
from contextlib import suppress
from multiprocessing.connection import Connection, wait
from multiprocessing.context import SpawnContext
from typing import Any

from gearshift.errors import GearshiftError

READY_TIMEOUT = 300.0  # seconds for N workers to import torch on a loaded machine
# seconds allowed per static-shape compile of a gear (a cold Inductor compile of the demo's
# models takes 5-30 s on the 2 loaded cores measured, a process's first one more: its C++
# prelude; a load from the cache a few seconds)
COMPILE_SECONDS = 60.0
POLL_SECONDS = 0.1
EXIT_TIMEOUT = 5.0


def compile_allowance(compiles: int, workers: int, cores: int | None = None) -> float:
    """Seconds added to a command's bound when each of `workers` workers may compile up to
    `compiles` gears in it: COMPILE_SECONDS per compile, times the workers per core (`cores`:
    this process's, by default), since the workers compile, or load what one of them
    compiled, side by side on those cores."""
    cores = cores or len(os.sched_getaffinity(0))
    return compiles * COMPILE_SECONDS * max(1, math.ceil(workers / cores))


def free_port() -> int:
    """A TCP port of 127.0.0.1 free now (an instance's process group meets there)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(conn: Connection, index: int, *shared: Any) -> None:
    from gearshift.tools.demo import worker  # torch is imported in the workers only

    worker.main(conn, index, *shared)


class WorkerProcesses:
    """The workers of one demo; `shared` are the arguments every worker gets after its index
    (the run's shared arrays and values); `ranks`: an instance's workers (tensor parallel)."""

    def __init__(self, ctx: SpawnContext, shared: tuple[Any, ...], ranks: int = 1) -> None:
        self.ctx, self.shared, self.ranks = ctx, shared, ranks
        self.procs: list[Any] = []
        self.conns: list[Connection] = []

    def start(self, count: int) -> None:
        """Start `count` workers and wait until every one is ready."""
        for i in range(count):
            ours, theirs = self.ctx.Pipe()
            proc = self.ctx.Process(
                target=_worker,
                args=(theirs, i, *self.shared),
                name=f"gearshift-demo-{i}",
                daemon=True,
            )
            # Ctrl-C is this process's to handle: a worker inherits SIGINT ignored from its
            # first instruction (a blocked mask is not inherited through spawn), so one
            # interrupted while it imports torch prints no traceback
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
            try:
                proc.start()
            finally:
                signal.signal(signal.SIGINT, previous)
            theirs.close()
            self.procs.append(proc)
            self.conns.append(ours)
        self.collect(range(count), "ready", time.monotonic() + READY_TIMEOUT)

    def send(self, *message: Any) -> None:
        """Send `message` to every worker, without waiting for replies."""
        for conn in self.conns:
            conn.send(message)

    def ask(self, workers: range, command: str, *args: Any, allowance: float = 0.0
            ) -> list[Any]:
        """Each worker's reply to `(command, *args)`, within READY_TIMEOUT + `allowance` s."""
        for i in workers:
            self.conns[i].send((command, *args))
        return self.collect(workers, command, time.monotonic() + READY_TIMEOUT + allowance)

    def collect(
        self,
        workers: range,
        command: str,
        deadline: float,
        tick: Callable[[], None] | None = None,
    ) -> list[Any]:
        """Each worker's reply to `command`, calling `tick` between looks; GearshiftError if a
        worker fails, dies or the deadline passes."""
        replies: dict[int, Any] = {}
        while len(replies) < len(workers):
            waiting = {self.conns[i]: i for i in workers if i not in replies}
            for conn in wait(list(waiting), timeout=POLL_SECONDS):
                i = waiting[conn]
                try:
                    kind, value = conn.recv()
                except EOFError:
                    raise GearshiftError(f"{self.name(i)} died during {command}") from None
                if kind == "error":
                    raise GearshiftError(f"{self.name(i)} failed during {command}:\n{value}")
                assert kind == command, (kind, command)
                replies[i] = value
            if time.monotonic() > deadline:
                raise GearshiftError(f"demo workers timed out during {command}")
            if tick is not None:
                tick()
        return [replies[i] for i in workers]

    def name(self, i: int) -> str:
        """Worker i as errors name it (with its instance and rank, tensor parallel)."""
        if self.ranks == 1:
            return f"demo worker {i}"
        return f"demo worker {i} (rank {i % self.ranks} of instance {i // self.ranks})"

    def end(self) -> None:
        """Ask every worker to exit, then terminate, then kill those left; close the pipes."""
        for conn in self.conns:
            with suppress(OSError):
                conn.send(("exit",))
        deadline = time.monotonic() + EXIT_TIMEOUT
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for stop in ("terminate", "kill"):
            alive = [p for p in self.procs if p.is_alive()]
            for proc in alive:
                getattr(proc, stop)()
            for proc in alive:
                proc.join(EXIT_TIMEOUT)
        for conn in self.conns:
            conn.close()
