"""A demo arm in this process: runners of the model, lanes per profile replaying merged rows a
slice at a time, the static arm and the adaptive one through a client of the controller."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

import numpy as np
import torch

import gearshift as gs
from gearshift.controller import embedded
from gearshift.controller.config import ControllerConfig
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim
from gearshift.tools.demo import arm
from gearshift.tools.demo.block import Model
from gearshift.tools.demo.workload import padded_pairs, padded_tokens, useful_tokens

DIMS = {"BATCHSIZE": Dim(gears=[1, 2, 4, 8], max=16, splittable=True), "SEQLEN": Dim(max=64)}
SIZES = {"BATCHSIZE": np.array([1, 3, 8, 5, 2, 11]), "SEQLEN": np.array([64, 5, 9, 1, 33, 7])}
VARIANTS = 4 * 7  # B 1, 2, 4, 8 x S 1 .. 64
ROWS = {"BATCHSIZE": Dim(gears=[2, 8], max=8, splittable=True)}  # a profile without SEQLEN
ROW_SIZES = {"BATCHSIZE": np.array([3, 8, 1])}
# merged rows: profile 0 ("seq") rows 0..5, profile 1 ("rows") rows 0..2, interleaved
WHICH = np.array([0, 1, 0, 0, 1, 0, 0, 1, 0])
LOCAL = np.array([0, 0, 1, 2, 1, 3, 4, 2, 5])


def model() -> Model:
    return Model(width=16, heads=2)


def counter() -> Callable[[int], int]:
    """A row counter as the workers share it: the next row, `end` when none is left before."""
    rows = itertools.count()
    taken = [0]

    def take(end: int) -> int:
        if taken[0] >= end:
            return end
        taken[0] = next(rows) + 1
        return taken[0] - 1

    return take


def test_runner_replays_what_the_model_computes_eagerly_on_unpadded_input() -> None:
    m = model()
    runner = arm.runner_for(m, DIMS)
    runner.capture(arm.variants(runner.gears))
    x = torch.randn(3, 5, 16)  # runs as B 4 x S 8: padded on both dims
    torch.testing.assert_close(runner.run({"x": x}), m(x))
    assert runner.stats == {"replays": 1, "eager": 0, "captures": VARIANTS, "capture_failures": 0}


def test_without_seqlen_every_row_is_a_sequence_of_one_token() -> None:
    assert arm.features(model(), ROWS) == (1, 16)
    runner = arm.runner_for(model(), ROWS)
    runner.capture(arm.variants(runner.gears))
    x = torch.randn(3, 1, 16)
    torch.testing.assert_close(runner.run({"x": x}), model()(x))


def test_runner_counts_what_its_captures_cost() -> None:
    m = model()
    runner = arm.runner_for(m, DIMS)
    checked = m.tokens  # the runner's padding check ran the model on a small probe
    runner.capture([{"BATCHSIZE": 2, "SEQLEN": 8}, {"BATCHSIZE": 1, "SEQLEN": 64}])
    runner.capture([{"BATCHSIZE": 2, "SEQLEN": 8}])  # ready: nothing to capture
    # each capture runs the model once, then replays to time and check the graph: all counts
    assert runner.capture_tokens == m.tokens - checked >= 16 + 64
    assert runner.capture_seconds > 0
    runner.run({"x": torch.randn(2, 5, 16)})  # B 2 x S 8: a request is no capture
    assert m.tokens == checked + runner.capture_tokens + 16


def test_the_count_of_a_thread_leaves_out_the_other_threads() -> None:
    m = model()
    counted = arm.Counted(m)
    counted(torch.randn(3, 16))
    mine, theirs = counted.model_cpu(), []

    def call() -> None:
        counted(torch.randn(5, 16))
        theirs.append(counted.model_cpu())

    thread = threading.Thread(target=call)
    thread.start()
    thread.join()
    assert counted.here() == 3 and counted.tokens == m.tokens == 3 + 5
    assert mine > 0 and theirs[0] > 0 and counted.model_cpu() == mine  # each thread's own
    m(torch.randn(2, 16))  # another runner's call of the model: not this one's
    assert counted.tokens == 3 + 5 and m.tokens == 3 + 5 + 2


def static_lanes() -> dict[str, tuple[Model, arm.Runner, dict[str, np.ndarray]]]:
    lanes = {}
    for name, dims, sizes in (("seq", DIMS, SIZES), ("rows", ROWS, ROW_SIZES)):
        m = model()
        lanes[name] = (m, arm.runner_for(m, dims), sizes)
    return lanes


def test_the_static_arm_captures_first_then_replays_merged_rows_slice_by_slice() -> None:
    lanes, progress = static_lanes(), [0, 0, 0]

    def report(*figures: int) -> None:
        progress[:] = figures

    a = arm.static_arm(lanes, WHICH, LOCAL, report)
    assert len(lanes["seq"][1].ready()) == VARIANTS and len(lanes["rows"][1].ready()) == 2
    take = counter()
    first, second = a.replay(take, 4), a.replay(take, 9)  # rows 0-3, then 4-8
    assert a.replay(take, 9)["profiles"]["seq"]["requests"] == 0  # nothing left before row 9
    seq = [first["profiles"]["seq"], second["profiles"]["seq"]]
    rows = [first["profiles"]["rows"], second["profiles"]["rows"]]
    assert [f["requests"] for f in seq] == [3, 3] and [f["requests"] for f in rows] == [1, 2]
    padded = int(padded_tokens(DIMS, SIZES).sum()) + int(padded_tokens(ROWS, ROW_SIZES).sum())
    useful = int(useful_tokens(SIZES).sum()) + int(useful_tokens(ROW_SIZES).sum())
    assert progress == [9, useful, padded]  # every profile's, together
    assert sum(f["padded"] for f in seq) == int(padded_tokens(DIMS, SIZES).sum())
    assert [f["padded"] for f in rows] == [8, 8 + 2]  # B 3 -> 8 (one chunk); 8, and 1 -> 2
    assert rows[1]["dims"]["BATCHSIZE"] == [8 + 1, 8 + 2]
    assert sum(f["padded_pairs"] for f in seq) == int(padded_pairs(DIMS, SIZES).sum())
    assert sum(f["useful_pairs"] for f in seq) == int(
        (useful_tokens(SIZES) * SIZES["SEQLEN"]).sum())
    assert seq[1]["dims"]["SEQLEN"] == [1 + 33 + 7, 1 + 64 + 8]  # seq rows 3 to 5
    for f in seq + rows:  # captures were before the slices; each lane counts its own model
        assert f["computed"] == f["padded"]
        assert f["captures"] == f["eager"] == f["capture_tokens"] == 0
        assert f["busy_seconds"] > 0 and 0 < f["busy_cpu"] <= f["busy_seconds"] + 1e-3
        assert 0 < f["model_cpu"] < f["busy_cpu"]  # the model's own, within the request's
    assert sum(f["replays"] for f in seq) == 7  # B 11 runs as 8 + 4: two chunks
    assert second["began"] <= second["ended"] and second["rss_mb"] > 0
    assert 0 < second["thread_cpu"] <= second["cpu"] + 1e-3


def test_the_adaptive_arm_routes_every_profile_through_one_client(
    namespace: str, tmp_path: object
) -> None:
    config = ControllerConfig(namespace=namespace, state_dir=str(tmp_path))
    controller = embedded.start(config, PolicyConfig())
    profiles = {"seq": (DIMS, SIZES), "rows": (ROWS, ROW_SIZES)}
    static = arm.static_arm(static_lanes(), WHICH, LOCAL)
    try:
        with gs.connect(namespace) as client:
            a = arm.AdaptiveArm(client, profiles, WHICH, LOCAL,
                                model=lambda p: static.lanes[p].model)  # a worker's way
            assert {p.name for p in a.profiles.values()} == {"seq", "rows"}
            take = counter()
            first, second = a.replay(take, 3), a.replay(take, 9)
            a.settle()
            after = a.figures()  # nothing since the last slice: no request, no capture
            alone = static.replay(counter(), 9)["profiles"]
    finally:
        assert controller.stop()
    for p, lane in a.lanes.items():  # one model per profile, the same inputs, counted apart
        assert lane.model is static.lanes[p].model
        assert all(torch.equal(x["x"], y["x"])
                   for x, y in zip(lane.inputs, static.lanes[p].inputs, strict=True))
        assert alone[p]["computed"] == alone[p]["padded"]  # the static runner's tokens only
    lanes = [first["profiles"], second["profiles"]]
    assert sum(f["seq"]["requests"] for f in lanes) == 6
    assert sum(f["rows"]["requests"] for f in lanes) == 3
    # no round changed the gears
    assert sum(f["seq"]["padded"] for f in lanes) == int(padded_tokens(DIMS, SIZES).sum())
    assert sum(f["rows"]["padded"] for f in lanes) == int(padded_tokens(ROWS, ROW_SIZES).sum())
    assert all(f[p]["captures"] == f[p]["eager"] == 0 for f in lanes for p in f)
    assert all(f[p]["computed"] == f[p]["padded"] for f in lanes for p in f)
    assert after["seq"]["requests"] == after["seq"]["captures"] == 0
    assert controller.controller.counts["folded"] >= 9


def test_a_lane_reports_captures_made_between_its_slices() -> None:
    m = model()
    runner = arm.runner_for(m, ROWS)
    lane = arm.Lane(m, runner, lambda i, request: _work(request), ROW_SIZES)
    assert lane.figures()["captures"] == 0  # its initial gears: before the first report
    lane.run(0)
    runner.capture([{"BATCHSIZE": 3}])  # as the swap thread does, after the slice
    f = lane.figures()
    assert (f["requests"], f["captures"], f["padded"]) == (1, 1, 4)
    assert f["computed"] - f["capture_tokens"] == 8  # row 0, B 3, ran on gear 8
    assert f["capture_tokens"] >= 3 and f["capture_cpu"] > 0
    assert lane.figures()["captures"] == lane.figures()["requests"] == 0


class _work:
    """A static route's bracket: the request's gear sums, here its raw sizes rounded to 4."""

    def __init__(self, request: dict[str, int]) -> None:
        self.work = [-(-n // 4) * 4 for n in request.values()]

    def __enter__(self) -> tuple[list[int], None]:
        return self.work, None  # no route: the runner's own gears

    def __exit__(self, *exc: object) -> None:
        pass
