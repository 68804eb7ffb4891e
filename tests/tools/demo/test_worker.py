"""A demo worker's arms, in this process: the model, calibration, the static and the adaptive
arm replaying slices of the same rows, the command loop."""

from __future__ import annotations

import itertools
import multiprocessing
from collections.abc import Callable

import numpy as np
import torch

import gearshift as gs
from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim
from gearshift.tools.demo import worker
from gearshift.tools.demo.workload import padded_pairs, padded_tokens, useful_tokens

DIMS = {"BATCHSIZE": Dim(gears=[1, 2, 4, 8], max=16, splittable=True), "SEQLEN": Dim(max=64)}
SIZES = {"BATCHSIZE": np.array([1, 3, 8, 5, 2, 11]), "SEQLEN": np.array([64, 5, 9, 1, 33, 7])}
VARIANTS = 4 * 7  # B 1, 2, 4, 8 x S 1 .. 64


def model() -> worker.Model:
    return worker.Model(width=16, heads=2)


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


def test_model_counts_tokens_and_runs_any_leading_shape() -> None:
    m = model()
    assert m(torch.ones(3, 5, 16)).shape == (3, 5, 16)
    assert m(torch.ones(7, 16)).shape == (7, 16)
    assert m.tokens == 15 + 7


def test_real_tokens_ignore_later_tokens_and_padding_but_attend_to_earlier_ones() -> None:
    m = model()
    x = torch.randn(2, 5, 16)
    padded = torch.cat([x, 100 * torch.randn(2, 3, 16)], dim=1)  # garbage, not zeros, after
    torch.testing.assert_close(m(padded)[:, :5], m(x))
    earlier = x.clone()
    earlier[:, 0] = torch.randn(2, 16)
    assert not torch.allclose(m(earlier)[:, 4], m(x)[:, 4])  # attention is not the identity
    torch.testing.assert_close(m(x)[1], m(x[1:])[0])  # rows of a batch are sequences apart


def test_runner_replays_what_the_model_computes_eagerly_on_unpadded_input() -> None:
    m = model()
    runner = worker.runner_for(m, DIMS)
    runner.capture(worker.variants(runner.gears))
    x = torch.randn(3, 5, 16)  # runs as B 4 x S 8: padded on both dims
    torch.testing.assert_close(runner.run({"x": x}), m(x))
    assert runner.stats == {"replays": 1, "eager": 0, "captures": VARIANTS, "capture_failures": 0}


def test_without_seqlen_every_row_is_a_sequence_of_one_token() -> None:
    dims = {"BATCHSIZE": DIMS["BATCHSIZE"]}
    assert worker.features(model(), dims) == (1, 16)
    runner = worker.runner_for(model(), dims)
    runner.capture(worker.variants(runner.gears))
    x = torch.randn(3, 1, 16)
    torch.testing.assert_close(runner.run({"x": x}), model()(x))


def test_the_static_arm_captures_first_then_replays_slice_by_slice() -> None:
    m, progress = model(), [0, 0, 0]
    runner = worker.runner_for(m, DIMS)

    def report(*figures: int) -> None:
        progress[:] = figures

    arm = worker.static_arm(m, runner, SIZES, report)
    assert len(runner.ready()) == VARIANTS  # captured before any slice
    take = counter()
    first, second = arm.replay(take, 2), arm.replay(take, 6)
    assert (first["requests"], second["requests"]) == (2, 4)
    assert arm.replay(take, 6)["requests"] == 0  # nothing left before row 6
    padded = int(padded_tokens(DIMS, SIZES).sum())
    useful = int(useful_tokens(SIZES).sum())
    assert first["useful"] + second["useful"] == useful and progress == [6, useful, padded]
    assert first["padded"] + second["padded"] == padded
    assert second["computed"] == second["padded"]  # captures were before the slices
    assert first["padded_pairs"] + second["padded_pairs"] == int(padded_pairs(DIMS, SIZES).sum())
    assert first["useful_pairs"] + second["useful_pairs"] == int(
        (useful_tokens(SIZES) * SIZES["SEQLEN"]).sum())
    assert second["captures"] == second["eager"] == second["capture_tokens"] == 0
    assert first["replays"] + second["replays"] == 7  # B 11 runs as 8 + 4: two chunks
    assert second["dims"]["SEQLEN"] == [9 + 1 + 33 + 7, 16 + 1 + 64 + 8]  # rows 2 to 5
    assert second["began"] <= second["ended"] and second["rss_mb"] > 0
    assert 0 < second["thread_cpu"] <= second["cpu"] + 1e-3


def test_calibration_times_each_sequence_gear() -> None:
    m = model()
    runner = worker.runner_for(m, DIMS)
    samples = worker.calibrate(m, runner)
    assert [(t, p) for t, p, _ in samples] == [(s, s * s) for s in (1, 2, 4, 8, 16, 32, 64)]
    assert all(seconds > 0 for *_, seconds in samples)
    assert len(runner.ready()) == VARIANTS  # kept for the static run


def test_runner_counts_what_its_captures_cost() -> None:
    runner = worker.runner_for(model(), DIMS)
    runner.capture([{"BATCHSIZE": 2, "SEQLEN": 8}, {"BATCHSIZE": 1, "SEQLEN": 64}])
    runner.capture([{"BATCHSIZE": 2, "SEQLEN": 8}])  # ready: nothing to capture
    assert runner.capture_tokens == 16 + 64 and runner.capture_seconds > 0


def test_the_adaptive_arm_routes_through_a_client_of_the_controller(
    namespace: str, tmp_path: object
) -> None:
    config = ControllerConfig(namespace=namespace, state_dir=str(tmp_path))
    controller = Controller.start_embedded(config, PolicyConfig())
    try:
        with gs.connect(namespace) as client:
            arm = worker.AdaptiveArm(client, DIMS, SIZES)
            take = counter()
            first, second = arm.replay(take, 3), arm.replay(take, 6)
            arm.settle()
    finally:
        assert controller.stop()
    assert first["requests"] + second["requests"] == 6
    # no round changed the gears
    assert first["padded"] + second["padded"] == int(padded_tokens(DIMS, SIZES).sum())
    assert second["captures"] == second["eager"] == 0
    assert controller.controller.counts["folded"] >= 6


class Pipe:
    def __init__(self, commands: list[tuple]) -> None:
        self.commands, self.sent = commands, []

    def recv(self) -> tuple:
        return self.commands.pop(0)

    def send(self, message: tuple) -> None:
        self.sent.append(message)


def test_command_loop_answers_each_command_then_exits() -> None:
    pipe = Pipe([("calibrate", DIMS), ("nonsense",), ("exit",)])
    queues = (multiprocessing.Value("q", 0), multiprocessing.Value("q", 0))
    worker.main(pipe, 0, [0] * 6, queues, multiprocessing.Value("d", 0.0))  # type: ignore[arg-type]
    assert [kind for kind, _ in pipe.sent] == ["ready", "calibrate", "error"]
    assert "KeyError: 'nonsense'" in pipe.sent[-1][1]


def test_command_loop_runs_both_arms_on_their_own_counters(
    namespace: str, tmp_path: object
) -> None:
    config = ControllerConfig(namespace=namespace, state_dir=str(tmp_path))
    controller = Controller.start_embedded(config, PolicyConfig())
    times = np.arange(6, dtype=np.float64)
    pipe = Pipe([("calibrate", DIMS), ("prepare", namespace, DIMS, DIMS, SIZES, times),
                 ("slice", "static", 4), ("slice", "adaptive", 2), ("slice", "adaptive", 6),
                 ("settle",), ("finish",), ("exit",)])
    queues = (multiprocessing.Value("q", 0), multiprocessing.Value("q", 0))
    progress = [0] * 6
    try:
        worker.main(pipe, 0, progress, queues, multiprocessing.Value("d", 0.0))  # type: ignore[arg-type]
    finally:
        assert controller.stop()
    kinds = [kind for kind, _ in pipe.sent]
    assert kinds == ["ready", "calibrate", "prepare", "slice", "slice", "slice", "settle",
                     "finish"], pipe.sent[-1]
    replies = dict(enumerate(value for _, value in pipe.sent))
    assert [replies[i]["requests"] for i in (3, 4, 5)] == [4, 2, 4]
    assert (queues[0].value, queues[1].value) == (4, 6)  # each arm's rows, never past the end
    assert progress[0] == 4 and progress[3] == 6  # static at 0, adaptive at 3 * workers
    assert replies[6]["seconds"] >= 0 and replies[6]["cpu"] >= 0
    assert not controller.controller.workers  # the client closed at "finish"
