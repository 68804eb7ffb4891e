"""The adaptive runner: variants over N dims, routing to ready variants, release via the pool."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

import gearshift as gs
from gearshift.graphs import AdaptiveRunner, Transform, adaptive
from gearshift.graphs.backends import CpuBackend
from gearshift.graphs.pool import GraphResourcePool
from gearshift.worker import Route
from graphs.recording import RecordingBackend

H = 4
torch.manual_seed(0)
LAYER = torch.nn.Linear(H, H)


@torch.no_grad()
def model(x: torch.Tensor, mask: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.tanh(LAYER(x)) * mask.unsqueeze(-1) * scale


def make(
    s_splittable: bool = False, backend: CpuBackend | None = None, fn: Callable[..., Any] = model
) -> AdaptiveRunner:
    dims = {
        "BATCHSIZE": gs.Dim(gears=[1, 2, 4], max=64, splittable=True),
        "SEQLEN": gs.Dim(gears=[8, 16], max=64, splittable=s_splittable),
    }
    transform = Transform(
        fn, dims, inputs={"x": ("B", "S", None), "mask": ("B", "S"), "scale": (None,)}
    )
    pool = GraphResourcePool(backend or CpuBackend())
    return AdaptiveRunner(transform, call(1, 1), pool=pool)


def call(b: int, s: int) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(b, s, H), "mask": torch.ones(b, s), "scale": torch.rand(H) + 0.5}


def all_variants(r: AdaptiveRunner) -> list[dict[str, int]]:
    return [{"BATCHSIZE": b, "SEQLEN": s} for b in r.gears["BATCHSIZE"] for s in r.gears["SEQLEN"]]


def check(r: AdaptiveRunner, b: int, s: int) -> None:
    t = call(b, s)
    torch.testing.assert_close(r.run(t), model(**t))


def test_capture_then_replay_equals_eager_and_never_captures() -> None:
    backend = RecordingBackend()
    r = make(backend=backend)
    assert r.capture(all_variants(r)) == 6 and r.capture(all_variants(r)) == 0
    assert r.ready() == [(1, 8), (1, 16), (2, 8), (2, 16), (4, 8), (4, 16)]
    assert len(r.pool) == 6 and r.stats["captures"] == 6
    for b, s in [(1, 1), (3, 9), (4, 16), (2, 5), (11, 7)]:  # 11 = 4 + 4 + 3: three replays
        check(r, b, s)
    assert r.stats == {"replays": 7, "eager": 0, "captures": 6, "capture_failures": 0}
    assert len(backend.captured) == 6 and len(r.pool) == 6  # the device captured nothing more


def test_capture_records_the_largest_variant_first() -> None:
    """The order the device is asked to capture in: by size (the product of the gears),
    largest first, so no variant before one that covers it, whatever order the variants are
    given in (mutation caught: `capture` sorting smallest first)."""
    backend = RecordingBackend()
    r = make(backend=backend)
    smallest_first = sorted(all_variants(r), key=lambda v: (v["BATCHSIZE"], v["SEQLEN"]))
    assert r.capture(smallest_first) == 6
    captured = [shape[:2] for shape in backend.captured]
    assert captured[0] == (4, 16) and sorted(captured) == [(b, s) for b in (1, 2, 4)
                                                           for s in (8, 16)]
    sizes = [b * s for b, s in captured]
    assert sizes == sorted(sizes, reverse=True)


def test_results_do_not_alias_graph_outputs() -> None:
    r = make()
    r.capture(all_variants(r))
    t1, t2 = call(2, 8), call(2, 8)
    y1 = r.run(t1)
    r.run(t2)
    torch.testing.assert_close(y1, model(**t1))


def test_static_outputs_are_copies_too() -> None:
    def f(x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * scale, scale * 2  # the second output has no dim axis: nothing to cut

    dims = {"BATCHSIZE": gs.Dim(gears=[2, 4], max=8)}
    transform = Transform(f, dims, inputs={"x": ("B", None), "scale": (None,)})
    example = {"x": torch.ones(1, H), "scale": torch.ones(H)}
    r = AdaptiveRunner(transform, example, pool=GraphResourcePool(CpuBackend()))
    r.capture([{"BATCHSIZE": 4}])
    t1 = {"x": torch.randn(3, H), "scale": torch.rand(H)}
    y1 = r.run(t1)
    r.run({"x": torch.randn(3, H), "scale": torch.rand(H)})
    torch.testing.assert_close(y1, f(**t1))
    assert r.stats["replays"] == 2


def test_outputs_unlike_the_declared_ones_fail_at_capture() -> None:
    dims = {"BATCHSIZE": gs.Dim(gears=[2, 4], max=8)}
    def two_at_4(x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return (x, x) if x.shape[0] == 4 else x  # padding-checked at 2: one output

    transform = Transform(two_at_4, dims, inputs={"x": ("B", None)}, outputs=("B", None))
    pool = GraphResourcePool(CpuBackend())
    r = AdaptiveRunner(transform, {"x": torch.ones(1, H)}, pool=pool)
    with pytest.raises(gs.ShapeError, match="fn returned 2 tensors, expected 1"):
        r.capture([{"BATCHSIZE": 4}])
    assert r.ready() == [] and len(pool) == 0


def test_not_ready_variant_routes_to_smallest_ready_cover_else_eager() -> None:
    masks: list[torch.Tensor] = []

    @torch.no_grad()
    def spy(x: torch.Tensor, mask: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        masks.append(mask.clone())  # on the cpu a replay runs fn on the graph's inputs
        return model(x, mask, scale)

    r = make(fn=spy)
    r.capture([{"BATCHSIZE": 4, "SEQLEN": 16}, {"BATCHSIZE": 2, "SEQLEN": 16}])
    check(r, 2, 16)  # fills every row and column of (2, 16)'s inputs
    check(r, 1, 3)  # (1, 8) not ready: runs on (2, 16), the smallest that covers it
    assert r.stats == {"replays": 2, "eager": 0, "captures": 2, "capture_failures": 0}
    ran_on = masks[-1]  # the padding is filled, not left over from the call before
    assert ran_on.shape == (2, 16) and ran_on[0, :3].eq(1).all()
    assert ran_on[0, 3:].eq(0).all() and ran_on[1].eq(0).all()
    r.release("BATCHSIZE", 4)
    r.release("BATCHSIZE", 2)
    check(r, 3, 3)  # nothing ready: eager chunk
    assert r.stats["eager"] == 1 and r.stats["replays"] == 2


def test_a_call_replays_the_smallest_ready_variant_covering_it() -> None:
    """(2, 16) and (4, 16) ready: a (1, 3) call replays (2, 16), seen by the shapes the graph's
    function runs on (mutation caught: `_ready` picking the largest cover, `max` for `min`)."""
    shapes: list[tuple[int, ...]] = []

    def seen(x: torch.Tensor, mask: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(x.shape))
        return model(x, mask, scale)

    dims = {"BATCHSIZE": gs.Dim(gears=[1, 2, 4], max=64), "SEQLEN": gs.Dim(gears=[8, 16], max=64)}
    transform = Transform(
        seen, dims, inputs={"x": ("B", "S", None), "mask": ("B", "S"), "scale": (None,)}
    )
    r = AdaptiveRunner(transform, call(1, 1), pool=GraphResourcePool(CpuBackend()))
    r.capture([{"BATCHSIZE": 4, "SEQLEN": 16}, {"BATCHSIZE": 2, "SEQLEN": 16}])
    shapes.clear()
    t = call(1, 3)
    torch.testing.assert_close(r.run(t), model(**t))
    assert shapes == [(2, 16, H)]  # a CPU graph's replay runs its function on its inputs
    assert r.stats["replays"] == 1 and r.stats["eager"] == 0


def test_chunks_remember_the_variants_they_wanted_until_taken() -> None:
    r = make(s_splittable=True)
    woken: list[tuple[int, ...]] = []
    r.on_want = lambda: woken.append(list(r._wanted)[-1])
    assert r.take_wanted() == []
    check(r, 3, 9)  # nothing ready: eager, and (4, 16) is wanted
    r.capture([{"BATCHSIZE": 4, "SEQLEN": 16}])
    for b, s in [(1, 3), (4, 16), (1, 5), (4, 40)]:  # (4, 16) ready: not wanted again
        check(r, b, s)  # 40 = 16 + 16 + 8: the (4, 8) chunk runs on (4, 16), wanted
    assert r.take_wanted() == [(4, 16), (1, 8), (4, 8)]  # first wanted first, each once
    assert woken == [(4, 16), (1, 8), (4, 8)]  # each woke the swap thread once
    assert r.take_wanted() == [] and r.stats["eager"] == 1 and r.stats["replays"] == 6


def test_wanted_variants_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(adaptive, "MAX_WANTED", 2)
    r = make()
    for b, s in [(1, 1), (2, 1), (3, 1), (1, 1)]:
        check(r, b, s)
    assert r.take_wanted() == [(1, 8), (2, 8)] and r.stats["eager"] == 4  # (4, 8) not kept
    check(r, 3, 1)
    assert r.take_wanted() == [(4, 8)]  # room again once taken


def test_one_dtype_rule_on_the_graph_and_the_eager_paths() -> None:
    r = make()
    r.capture(all_variants(r))
    for b, s in [(2, 8), (2, 17)]:  # a replay, and a non-splittable overflow (eager)
        t = call(b, s)
        t["x"] = t["x"].double()
        with pytest.raises(gs.ShapeError, match=r"x is torch\.float64; the graphs were built for"):
            r.run(t)
    t = call(2, 8) | {"scale": torch.ones(H, dtype=torch.float64)}  # unbound inputs too
    with pytest.raises(gs.ShapeError, match=r"scale is torch\.float64"):
        r.run(t)
    assert r.stats["replays"] == r.stats["eager"] == 0


def test_eager_chunks_run_while_another_call_replays() -> None:
    """A call no ready variant covers runs eagerly while another thread's replay is under way
    (on the cpu a replay runs fn: held here inside it); eager chunks never wait for replays."""
    inside, go = threading.Event(), threading.Event()
    holding = False

    @torch.no_grad()
    def held(x: torch.Tensor, mask: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        if holding and x.shape[0] == 2:  # the replay of (2, 16)
            inside.set()
            go.wait(30)
        return model(x, mask, scale)

    r = make(s_splittable=True, fn=held)
    r.capture([{"BATCHSIZE": 2, "SEQLEN": 16}])
    holding = True
    replaying = threading.Thread(target=lambda: r.run(call(2, 16)))
    replaying.start()
    results: list[torch.Tensor] = []
    t = call(3, 20)  # batch 3 runs on gear 4: no ready variant covers it
    try:
        assert inside.wait(30)
        worker = threading.Thread(target=lambda: results.append(r.run(t)))
        worker.start()
        worker.join(timeout=30)
        assert not worker.is_alive()
    finally:
        go.set()
        replaying.join(30)
    torch.testing.assert_close(results[0], model(**t))
    assert r.stats["eager"] == 2 and r.stats["replays"] == 1  # SEQLEN 20 = 16 + 4


def test_non_splittable_overflow_runs_eager() -> None:
    r = make()
    r.capture(all_variants(r))
    check(r, 2, 17)
    assert r.stats == {"replays": 0, "eager": 1, "captures": 6, "capture_failures": 0}


def test_two_split_dims() -> None:
    r = make(s_splittable=True)
    r.capture(all_variants(r))
    check(r, 6, 40)  # B: 4 + 2, S: 16 + 16 + 8
    assert r.stats["replays"] == 6


def test_release_frees_every_variant_of_a_gear_once() -> None:
    r = make()
    r.capture(all_variants(r))
    assert r.release("SEQLEN", 8) == 3
    assert r.ready() == [(1, 16), (2, 16), (4, 16)] and len(r.pool) == 3
    assert r.release("BATCHSIZE", 1) == 1  # (1, 8) already went with SEQLEN 8
    assert r.release("BATCHSIZE", 1) == 0
    assert r.ready() == [(2, 16), (4, 16)]
    check(r, 1, 8)  # runs on (2, 16)
    assert r.stats["replays"] == 1
    with pytest.raises(gs.ShapeError, match="unknown dim 'HEADS'"):
        r.release("HEADS", 1)


def test_new_larger_gear_grows_the_buffers() -> None:
    backend = RecordingBackend()
    r = make(backend=backend)
    r.capture([{"BATCHSIZE": 4, "SEQLEN": 16}])
    r.gears = {"BATCHSIZE": (1, 2, 4, 8), "SEQLEN": (8, 16, 32)}
    r.capture([{"BATCHSIZE": 8, "SEQLEN": 32}])
    assert backend.captured == [(4, 16, H), (8, 32, H)]  # the old graph is not captured again
    for b, s in [(7, 30), (3, 16), (4, 10)]:
        check(r, b, s)
    assert r.stats["replays"] == 3


def test_bad_variants_and_static_axes() -> None:
    r = make()
    with pytest.raises(gs.ShapeError, match="one gear per dim"):
        r.capture([{"BATCHSIZE": 4}])
    with pytest.raises(gs.ShapeError, match="SEQLEN=65 is outside"):
        r.capture([{"BATCHSIZE": 4, "SEQLEN": 65}])
    bad = call(2, 8) | {"scale": torch.ones(H + 1)}
    with pytest.raises(gs.ShapeError, match="scale axis 0 is 5; the graphs were built for 4"):
        r.run(bad)


def test_capture_on_a_warm_up_thread_while_serving() -> None:
    r = make()
    r.capture([{"BATCHSIZE": 4, "SEQLEN": 16}])
    warm_up = threading.Thread(target=r.capture, args=(all_variants(r),))
    warm_up.start()
    for i in range(40):
        check(r, 1 + i % 9, 1 + i % 16)
    warm_up.join(timeout=30)
    assert not warm_up.is_alive() and len(r.ready()) == 6
    assert r.stats["eager"] == 0 and r.stats["replays"] >= 40


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_variants_match_eager() -> None:
    layer = torch.nn.Linear(H, H).cuda()

    @torch.no_grad()
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(layer(x))

    dims = {"BATCHSIZE": gs.Dim(gears=[1, 2, 4], max=64, splittable=True)}
    transform = Transform(f, dims, inputs={"x": ("B", None)})
    r = AdaptiveRunner(transform, {"x": torch.ones(1, H, device="cuda")})
    r.capture([{"BATCHSIZE": g} for g in (1, 2, 4)])
    for b in (1, 3, 4, 9):
        x = torch.randn(b, H, device="cuda")
        torch.testing.assert_close(r.run({"x": x}), f(x))
    assert r.stats["eager"] == 0 and r.release("BATCHSIZE", 4) == 1


def test_buffer_bytes_are_the_static_buffers_at_the_largest_gears_captured() -> None:
    r = make()  # x: B x S x H floats and mask: B x S floats, at (4, 16); scale is not bound
    size = 4 * 16 * (H + 1) * 4
    assert r.buffer_bytes() == {"BATCHSIZE": (4, size, size), "SEQLEN": (16, size, size)}
    r.capture([{"BATCHSIZE": 8, "SEQLEN": 16}])  # beyond the buffers: larger ones
    assert r.buffer_bytes()["BATCHSIZE"] == (8, 2 * size, 2 * size)


def test_a_route_is_replayed_as_given_with_no_lookup_of_the_runners_own() -> None:
    """A route found elsewhere (another process's router of the same profile) runs as is: its
    variant's graph, though the runner's gears would pick a smaller one; a split route's
    chunks, though its gears would pick one; an eager route eagerly."""
    shapes: list[tuple[int, ...]] = []

    def seen(x: torch.Tensor, mask: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        shapes.append(tuple(x.shape))
        return model(x, mask, scale)

    r = make(fn=seen)
    r.capture(all_variants(r))
    shapes.clear()
    t = call(1, 3)
    sizes = r.transform.check(t)
    one = Route(7, {"BATCHSIZE": (4,), "SEQLEN": (16,)}, (4, 16))
    torch.testing.assert_close(r.run(t, sizes, one), model(**t))
    assert shapes == [(4, 16, H)]
    t = call(3, 3)
    split = Route(7, {"BATCHSIZE": (2, 1), "SEQLEN": (8,)})
    torch.testing.assert_close(r.run(t, r.transform.check(t), split), model(**t))
    assert shapes[1:] == [(2, 8, H), (1, 8, H)]
    eager = Route(7, {"BATCHSIZE": (4,), "SEQLEN": ()})
    torch.testing.assert_close(r.run(t, r.transform.check(t), eager), model(**t))
    assert shapes[3:] == [(3, 3, H)] and r.stats["eager"] == 1 and r.stats["replays"] == 3


def test_a_route_that_does_not_cover_the_call_is_refused() -> None:
    r = make(s_splittable=True)
    r.capture(all_variants(r))
    t = call(3, 9)
    sizes = r.transform.check(t)
    for route in (Route(1, {"BATCHSIZE": (2,), "SEQLEN": (16,)}, (2, 16)),  # 3 rows > 2
                  Route(1, {"BATCHSIZE": (2,), "SEQLEN": (8, 8)}),  # 3 rows > 2
                  Route(1, {"BATCHSIZE": (4,), "SEQLEN": (8, 8, 8)})):  # a chunk past 9
        with pytest.raises(gs.ShapeError, match="route"):
            r.run(t, sizes, route)
    assert r.stats["replays"] == r.stats["eager"] == 0
