"""The demo's bounds on its workers' replies: READY_TIMEOUT, plus an allowance that scales
with the compiles a command may run (`--backend compile`), never none."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator

import pytest

from gearshift.core.config import PolicyConfig
from gearshift.errors import GearshiftError
from gearshift.tools.demo import processes
from gearshift.tools.demo.mix import load_mix
from gearshift.tools.demo.processes import COMPILE_SECONDS, WorkerProcesses, compile_allowance
from gearshift.tools.demo.run import Demo

DELAY = 0.3  # seconds before the fake worker replies


def test_the_allowance_is_per_compile_and_per_worker_beyond_the_cores() -> None:
    assert compile_allowance(0, 4, cores=2) == 0.0
    assert compile_allowance(21, 1, cores=2) == compile_allowance(21, 2, cores=2) == \
        21 * COMPILE_SECONDS
    assert compile_allowance(21, 3, cores=2) == compile_allowance(21, 4, cores=2) == \
        2 * 21 * COMPILE_SECONDS  # twice the workers the cores run at once: twice as long


@pytest.fixture
def late_worker() -> Iterator[WorkerProcesses]:
    """WorkerProcesses with one worker, a thread that answers each command DELAY s late."""
    workers = WorkerProcesses(multiprocessing.get_context("spawn"), ())
    ours, theirs = multiprocessing.Pipe()
    workers.conns.append(ours)

    def answer() -> None:
        try:
            while True:
                command, *_ = theirs.recv()
                threading.Event().wait(DELAY)
                theirs.send((command, "done"))
        except (EOFError, OSError):
            return

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield workers
    ours.close()
    thread.join(5.0)
    theirs.close()


def test_a_command_gets_its_allowance_beyond_the_bound_and_times_out_without(
    late_worker: WorkerProcesses, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(processes, "READY_TIMEOUT", 0.0)  # a bound the reply always misses
    with pytest.raises(GearshiftError, match="timed out during calibrate"):
        late_worker.ask(range(1), "calibrate")
    late_worker.collect(range(1), "calibrate", float("inf"))  # the late reply, read
    assert late_worker.ask(range(1), "calibrate", allowance=60.0) == ["done"]


def test_the_demo_allows_for_every_variant_it_may_compile_and_nothing_with_eager_graphs(
) -> None:
    mix = load_mix("azure_code")
    gears = {p: {d: dim.initial_gears for d, dim in w.dims.items()}
             for p, w in mix.profiles.items()}
    assert [len(g) for w in gears.values() for g in w.values()] == [14, 7]

    def demo(compile: str | None) -> Demo:
        return Demo(mix, 2, 30.0, "unused", PolicyConfig(), lambda p: None, "llama", compile)

    assert demo("inductor")._allowance(gears) == compile_allowance(21, 2)
    assert demo("inductor")._allowance({"p": {"A": (1, 2), "B": (1, 2, 3)}}) == \
        compile_allowance(6, 2)  # a variant is one gear per dim
    assert demo(None)._allowance(gears) == 0.0


@pytest.mark.parametrize(("ranks", "named"), [
    (1, "demo worker 3 failed during slice"),
    (2, "demo worker 3 (rank 1 of instance 1) failed during slice"),
])
def test_a_failing_worker_is_named_with_its_rank_and_instance(ranks: int, named: str) -> None:
    workers = WorkerProcesses(multiprocessing.get_context("spawn"), (), ranks)
    pairs = [multiprocessing.Pipe() for _ in range(4)]
    workers.conns = [ours for ours, _ in pairs]
    for i, (_, theirs) in enumerate(pairs):
        theirs.send(("error", "GroupError: boom") if i == 3 else ("slice", {}))
    try:
        with pytest.raises(GearshiftError, match="GroupError: boom") as e:
            workers.collect(range(4), "slice", float("inf"))
        assert named in str(e.value)
    finally:
        for ours, theirs in pairs:
            ours.close()
            theirs.close()
