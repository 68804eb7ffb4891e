"""A demo worker's runs, in this process: the model, the static and the adaptive replay."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gearshift.config import PolicyConfig
from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller
from gearshift.demo import worker
from gearshift.demo.workload import padded_tokens, useful_tokens
from gearshift.dims import Dim

DIMS = {"BATCHSIZE": Dim(gears=[1, 2, 4, 8], max=16, splittable=True), "SEQLEN": Dim(max=64)}
SIZES = {"BATCHSIZE": np.array([1, 3, 8, 5, 2, 11]), "SEQLEN": np.array([64, 5, 9, 1, 33, 7])}
VARIANTS = 4 * 7  # B 1, 2, 4, 8 x S 1 .. 64


def test_model_counts_the_tokens_it_computes_and_runs_any_leading_shape() -> None:
    model = worker.Model(width=8)
    assert model(torch.ones(3, 5, 8)).shape == (3, 5, 8)
    assert model(torch.ones(7, 8)).shape == (7, 8)
    assert model.tokens == 15 + 7


def test_runner_replays_what_the_model_computes_eagerly() -> None:
    model = worker.Model(width=8)
    runner = worker.runner_for(model, DIMS)
    runner.capture(worker.variants(runner.gears))
    x = torch.randn(3, 5, 8)
    torch.testing.assert_close(runner.run({"x": x}), model(x))
    assert runner.stats == {"replays": 1, "eager": 0, "captures": VARIANTS}


def test_static_run_reports_tokens_progress_and_captures() -> None:
    model, progress = worker.Model(width=8), [0] * 6
    result = worker.static(model, progress, 1, DIMS, SIZES)
    padded = int(padded_tokens(DIMS, SIZES).sum())
    assert result["requests"] == 6 and result["useful"] == int(useful_tokens(SIZES).sum())
    assert result["padded"] == padded
    assert progress[3:] == [6, result["useful"], padded] and progress[:3] == [0, 0, 0]
    assert result["captures"] == VARIANTS and result["eager"] == 0
    assert result["replays"] == 7  # B 11 runs as 8 + 4: two chunks
    captured = sum(b * s for b in (1, 2, 4, 8) for s in (1, 2, 4, 8, 16, 32, 64))
    assert result["computed"] == padded + captured
    assert result["dims"]["SEQLEN"] == [int(SIZES["SEQLEN"].sum()), 64 + 8 + 16 + 1 + 64 + 8]
    assert result["began"] <= result["ended"] and result["cpu"] > 0


def test_calibration_gives_seconds_per_padded_token() -> None:
    assert 0 < worker.calibrate(worker.Model(width=8), DIMS, SIZES) < 1e-3


def test_adaptive_run_routes_through_a_client_of_the_controller(
    namespace: str, tmp_path: object
) -> None:
    config = ControllerConfig(namespace=namespace, state_dir=str(tmp_path))
    controller = Controller.start_embedded(config, PolicyConfig())
    try:
        model, progress = worker.Model(width=8), [0] * 3
        result = worker.adaptive(model, progress, 0, namespace, DIMS, SIZES)
    finally:
        assert controller.stop()
    assert result["requests"] == 6 and progress[0] == 6
    assert result["padded"] == int(padded_tokens(DIMS, SIZES).sum())  # no round changed gears
    assert result["captures"] == VARIANTS and result["eager"] == 0
    assert controller.controller.counts["folded"] >= 6


@pytest.mark.parametrize("command", ["calibrate", "static"])
def test_command_loop_answers_each_command_then_exits(command: str) -> None:
    class Pipe:
        def __init__(self, commands: list[tuple]) -> None:
            self.commands, self.sent = commands, []

        def recv(self) -> tuple:
            return self.commands.pop(0)

        def send(self, message: tuple) -> None:
            self.sent.append(message)

    pipe = Pipe([(command, DIMS, SIZES), ("nonsense",), ("exit",)])
    worker.main(pipe, [0] * 3, 0)  # type: ignore[arg-type]
    assert [kind for kind, _ in pipe.sent] == ["ready", command, "error"]
    assert "KeyError: 'nonsense'" in pipe.sent[2][1]
