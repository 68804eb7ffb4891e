"""The compile backend: a static-shape compile per variant, correct against eager, released
with its gear, past Dynamo's recompile limit, graph breaks reported. Few compiles (each costs
seconds on the CPU): Inductor only where its code is checked, Dynamo's `eager` backend
elsewhere."""

from __future__ import annotations

import gc
import logging
from pathlib import Path

import pytest
import torch
from forked import in_child

import gearshift as gs
from gearshift.graphs import Transform
from gearshift.graphs.backends import CpuBackend
from gearshift.graphs.pool import GraphResourcePool
from gearshift.graphs.torchcompile import CompiledRunner

H = 4
TOLERANCE = 1e-5  # absolute and relative, float32: Inductor may reorder a reduction
torch.manual_seed(0)
WEIGHT = torch.randn(H, H)


def block(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ WEIGHT) + x.softmax(-1)


def make(fn: object = block, gears: tuple[int, ...] = (4, 16), **options: object) -> CompiledRunner:
    dims = {"SEQLEN": gs.Dim(gears=list(gears), max=64, splittable=True)}
    transform = Transform(fn, dims, inputs={"x": ("S", None)}, outputs=("S", None))
    return CompiledRunner(transform, {"x": torch.zeros(1, H)},
                          pool=GraphResourcePool(CpuBackend()), **options)


def test_each_gear_is_compiled_and_matches_eager_on_the_unpadded_input(
    inductor_cache: Path,
) -> None:
    runner = make()
    assert runner.capture([{"SEQLEN": 16}, {"SEQLEN": 4}]) == 2
    assert runner.ready() == [(4,), (16,)]
    for n in (3, 11, 20):  # 20: split into 16 + 4
        x = torch.randn(n, H)
        torch.testing.assert_close(runner.run({"x": x}), block(x), atol=TOLERANCE,
                                   rtol=TOLERANCE)
    assert runner.stats["eager"] == 0 and runner.stats["compiles"] == 2
    assert [c.variant for c in runner.compiles] == [{"SEQLEN": 16}, {"SEQLEN": 4}]
    assert all(c.fullgraph and c.seconds > 0 for c in runner.compiles)
    costs = dict((v["SEQLEN"], c) for v, c in runner.take_measurements())
    for c in runner.compiles:  # the compile is part of what the graph cost to add
        assert costs[c.variant["SEQLEN"]].capture_seconds >= c.seconds
    if any(inductor_cache.iterdir()):  # Inductor wrote its artifacts where it was told
        assert runner.stats["compile_cache_hits"] + runner.stats["compile_cache_misses"] >= 2


def test_a_released_gear_drops_its_compiled_code(inductor_cache: Path) -> None:
    runner = make()
    runner.capture([{"SEQLEN": 16}, {"SEQLEN": 4}])
    assert runner.compiled((4,)) is not None
    assert runner.release("SEQLEN", 4) == 1
    gc.collect()
    assert runner.compiled((4,)) is None and runner.compiled((16,)) is not None
    x = torch.randn(3, H)  # now padded to 16
    torch.testing.assert_close(runner.run({"x": x}), block(x), atol=TOLERANCE, rtol=TOLERANCE)


def test_more_gears_than_the_recompile_limit_stay_compiled() -> None:
    from torch._dynamo.utils import counters

    gears = (2, 3, 5, 7, 9)  # more than the limit, one function
    runner = make(gears=gears, compile_backend="eager")
    before = counters["stats"]["unique_graphs"]
    with torch._dynamo.config.patch(recompile_limit=2):
        assert runner.capture([{"SEQLEN": g} for g in gears]) == len(gears)
    assert counters["stats"]["unique_graphs"] - before == len(gears)  # none fell back to eager
    for n in gears:
        x = torch.randn(n, H)
        torch.testing.assert_close(runner.run({"x": x}), block(x))
    assert runner.stats["eager"] == 0


def broken(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    torch._dynamo.graph_break()
    return y + 1


def test_a_graph_break_is_reported_and_compiled_around(caplog: pytest.LogCaptureFixture) -> None:
    runner = make(broken, gears=(4, 8), compile_backend="eager")
    with caplog.at_level(logging.WARNING, "gearshift.graphs.torchcompile"):
        assert runner.capture([{"SEQLEN": 8}, {"SEQLEN": 4}]) == 2
    assert runner.graph_breaks and not runner.fullgraph
    assert runner.stats["graph_breaks"] >= 1
    (record,) = [r for r in caplog.records if "graph break" in r.getMessage()]  # once
    assert "graph_break" in record.getMessage()
    assert [c.fullgraph for c in runner.compiles] == [False, False]
    x = torch.randn(3, H)
    torch.testing.assert_close(runner.run({"x": x}), broken(x))


def test_a_closed_runner_compiles_nothing_more_and_keeps_its_graphs() -> None:
    runner = make(gears=(4, 8), compile_backend="eager")
    assert runner.capture([{"SEQLEN": 8}]) == 1
    assert runner.close(timeout=1.0)  # no compile under way: at once
    assert runner.capture([{"SEQLEN": 4}]) == 0 and runner.ready() == [(8,)]
    x = torch.randn(3, H)
    torch.testing.assert_close(runner.run({"x": x}), block(x))


def elementwise(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).sin() + 1


def test_a_child_forked_while_the_parent_compiles_can_compile_and_close() -> None:
    """A pre-fork server forks while the swap thread compiles: the child inherits the capture
    lock (and Dynamo's compile lock) held by a thread it does not have. It must compile its own
    gears and close at once (before: no compile ever, and `close` waited 600 s)."""
    import os
    import threading
    import time

    parent = os.getpid()
    started, go = threading.Event(), threading.Event()

    def slow(gm: torch.fx.GraphModule, example: object) -> object:
        if os.getpid() == parent:
            started.set()
            go.wait(30)
        return gm.forward

    runner = make(elementwise, gears=(4, 8), compile_backend=slow)  # no OpenMP team: a
    # child cannot join the parent's (libgomp), whatever gearshift does
    compiling = threading.Thread(target=runner.capture, args=([{"SEQLEN": 8}],))
    compiling.start()
    try:
        assert started.wait(30)

        def child() -> str:  # what the child could do, reported
            done = runner.capture([{"SEQLEN": 4}])
            began = time.monotonic()
            closed = runner.close(timeout=5.0)
            x = torch.randn(3, H)
            same = bool(torch.allclose(runner.run({"x": x}), elementwise(x)))
            return repr((done, closed, time.monotonic() - began < 2, same))

        status, found = in_child(child, 40)
    finally:
        go.set()
        compiling.join(30)
    assert found == repr((1, True, True, True)), (status, found)


REQUESTS = 0


def counted(x: torch.Tensor) -> torch.Tensor:
    global REQUESTS
    REQUESTS += 1  # a request counter: Python state Dynamo guards on
    return (x * 2).sin() + 1


def test_a_python_side_effect_runs_eagerly_instead_of_failing_a_request(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A counter in the function made every replay recompile, and past the recompile limit
    fullgraph raised FailOnRecompileLimitHit into the 5th request (plain torch.compile serves
    it). Now the compile finds it and the runner runs it eagerly, counting every request."""
    runner = make(counted, gears=(4, 8), compile_backend="eager")
    with caplog.at_level(logging.WARNING, "gearshift.graphs.torchcompile"):
        assert runner.capture([{"SEQLEN": 8}, {"SEQLEN": 4}]) == 0
    assert runner.refused is not None and "changes Python state" in runner.refused
    assert any("Keep such state outside fn" in r.getMessage() for r in caplog.records)
    before = REQUESTS
    for n in range(1, 13):
        x = torch.randn(n, H)
        torch.testing.assert_close(runner.run({"x": x}), (x * 2).sin() + 1)
    assert REQUESTS - before == 12 and runner.stats["eager"] == 12
    assert runner.capture([{"SEQLEN": 4}]) == 0  # nothing compiled after


def test_a_long_compile_is_logged_once_with_its_shape_and_seconds(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Inductor compiles a cold gear for 10-20 s: a progress line says what and how long
    (before: nothing while it ran)."""
    import time

    def slow(gm: torch.fx.GraphModule, example: object) -> object:
        time.sleep(0.5)  # a slow compiler, not the clock: the runner's clock is its own
        return gm.forward

    runner = make(elementwise, gears=(4, 8), compile_backend=slow)
    runner.progress_after = 0.1
    with caplog.at_level(logging.INFO, "gearshift.graphs.torchcompile"):
        assert runner.capture([{"SEQLEN": 8}]) == 1
    lines = [r.getMessage() for r in caplog.records]
    (still,) = [line for line in lines if line.startswith("compiling ")]
    assert "elementwise at SEQLEN=8 (x (8, 4) float32)" in still and "s so far" in still
    (done,) = [line for line in lines if line.startswith("compiled ")]
    assert "SEQLEN=8" in done and float(done.split(" in ")[1].split()[0]) >= 0.1


SCALE = 1.0


def scaled(x: torch.Tensor) -> torch.Tensor:
    return (x * SCALE).sin()


def test_state_the_caller_changes_never_fails_a_request() -> None:
    """A float the caller changes between requests fails the compiled guards each time: past
    the recompile limit the full graph raised FailOnRecompileLimitHit into the request, where
    plain torch.compile runs it eagerly; now so does the runner."""
    global SCALE
    runner = make(scaled, gears=(4, 8), compile_backend="eager")
    assert runner.capture([{"SEQLEN": 8}, {"SEQLEN": 4}]) == 2 and runner.refused is None
    with torch._dynamo.config.patch(recompile_limit=2):
        try:
            for step in range(6):
                SCALE = 1.0 + step
                x = torch.randn(3, H)
                torch.testing.assert_close(runner.run({"x": x}), scaled(x))
        finally:
            SCALE = 1.0
    assert runner.stats["replays"] == 6
