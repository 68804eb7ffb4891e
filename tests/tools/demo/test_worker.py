"""A demo worker's runs, in this process: the model, calibration, the static and the adaptive
replay, the command loop."""

from __future__ import annotations

import itertools
import multiprocessing

import numpy as np
import pytest
import torch

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


def feed(progress: list[int] | None = None) -> worker.Feed:
    def report(*figures: int) -> None:
        if progress is not None:
            progress[:] = figures

    return worker.Feed(itertools.count().__next__, lambda: None, report)


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
    assert runner.stats == {"replays": 1, "eager": 0, "captures": VARIANTS}


def test_without_seqlen_every_row_is_a_sequence_of_one_token() -> None:
    dims = {"BATCHSIZE": DIMS["BATCHSIZE"]}
    assert worker.features(model(), dims) == (1, 16)
    runner = worker.runner_for(model(), dims)
    runner.capture(worker.variants(runner.gears))
    x = torch.randn(3, 1, 16)
    torch.testing.assert_close(runner.run({"x": x}), model()(x))


def test_static_run_starts_after_its_captures_and_reports_its_figures() -> None:
    m, progress = model(), [0, 0, 0]
    runner = worker.runner_for(m, DIMS)

    def start() -> None:
        assert len(runner.ready()) == VARIANTS  # captured before the clock starts
        started.append(m.tokens)

    started: list[int] = []
    run = worker.Feed(itertools.count().__next__, start, feed(progress=progress).report)
    result = worker.static(m, runner, SIZES, run)
    padded = int(padded_tokens(DIMS, SIZES).sum())
    assert (
        started and result["requests"] == 6 and result["useful"] == int(useful_tokens(SIZES).sum())
    )
    assert result["padded"] == result["computed"] == padded  # captures were before the start
    assert result["padded_pairs"] == int(padded_pairs(DIMS, SIZES).sum())
    assert result["useful_pairs"] == int((useful_tokens(SIZES) * SIZES["SEQLEN"]).sum())
    assert progress == [6, result["useful"], padded]
    assert result["captures"] == result["eager"] == result["capture_tokens"] == 0
    assert result["replays"] == 7  # B 11 runs as 8 + 4: two chunks
    assert result["dims"]["SEQLEN"] == [int(SIZES["SEQLEN"].sum()), 64 + 8 + 16 + 1 + 64 + 8]
    assert result["began"] <= result["ended"] and result["cpu"] > 0 and result["rss_mb"] > 0


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


def test_adaptive_run_routes_through_a_client_of_the_controller(
    namespace: str, tmp_path: object
) -> None:
    config = ControllerConfig(namespace=namespace, state_dir=str(tmp_path))
    controller = Controller.start_embedded(config, PolicyConfig())
    try:
        result = worker.adaptive(model(), namespace, DIMS, SIZES, feed())
    finally:
        assert controller.stop()
    assert result["requests"] == 6
    assert result["padded"] == int(padded_tokens(DIMS, SIZES).sum())  # no round changed gears
    assert result["captures"] == result["eager"] == 0
    assert controller.controller.counts["folded"] >= 6


@pytest.mark.parametrize(
    ("commands", "replies"),
    [
        ([("calibrate", DIMS)], ["calibrate"]),
        ([("static", DIMS, SIZES), ("go",)], ["prepared", "static"]),
    ],
)
def test_command_loop_answers_each_command_then_exits(commands: list, replies: list) -> None:
    class Pipe:
        def __init__(self, commands: list[tuple]) -> None:
            self.commands, self.sent = commands, []

        def recv(self) -> tuple:
            return self.commands.pop(0)

        def send(self, message: tuple) -> None:
            self.sent.append(message)

    pipe = Pipe([*commands, ("nonsense",), ("exit",)])
    queue, origin = multiprocessing.Value("q", 0), multiprocessing.Value("d", 0.0)
    worker.main(pipe, 0, [0] * 3, queue, origin)  # type: ignore[arg-type]
    assert [kind for kind, _ in pipe.sent] == ["ready", *replies, "error"]
    assert "KeyError: 'nonsense'" in pipe.sent[-1][1]
    assert queue.value == (7 if "static" in replies else 0)  # 6 rows taken, then one past
