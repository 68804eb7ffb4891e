"""A demo worker's commands, in this process: calibration per profile and the command loop
running both arms, every profile on each, on their own row counters."""

from __future__ import annotations

import multiprocessing

import numpy as np

from gearshift.controller import embedded
from gearshift.controller.config import ControllerConfig
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim
from gearshift.tools.demo import arm, worker
from gearshift.tools.demo.block import Model

DIMS = {"BATCHSIZE": Dim(gears=[1, 2, 4, 8], max=16, splittable=True), "SEQLEN": Dim(max=64)}
SIZES = {"BATCHSIZE": np.array([1, 3, 8, 5, 2, 11]), "SEQLEN": np.array([64, 5, 9, 1, 33, 7])}
VARIANTS = 4 * 7  # B 1, 2, 4, 8 x S 1 .. 64
ROWS = {"BATCHSIZE": Dim(gears=[2, 8], max=8, splittable=True)}
ROW_SIZES = {"BATCHSIZE": np.array([3, 8])}


def test_calibration_times_each_sequence_gear() -> None:
    m = Model(width=16, heads=2)
    runner = arm.runner_for(m, DIMS)
    samples = worker.calibrate(m, runner)
    assert [(t, p) for t, p, _ in samples] == [(s, s * s) for s in (1, 2, 4, 8, 16, 32, 64)]
    assert all(seconds > 0 for *_, seconds in samples)
    assert len(runner.ready()) == VARIANTS  # kept for the static run


class Pipe:
    def __init__(self, commands: list[tuple]) -> None:
        self.commands, self.sent = commands, []

    def recv(self) -> tuple:
        return self.commands.pop(0)

    def send(self, message: tuple) -> None:
        self.sent.append(message)


def queues() -> tuple:
    return multiprocessing.Value("q", 0), multiprocessing.Value("q", 0)


def test_command_loop_answers_each_command_then_exits() -> None:
    pipe = Pipe([("calibrate", {"a": DIMS, "b": ROWS}), ("nonsense",), ("exit",)])
    worker.main(pipe, 0, [0] * 6, queues(), multiprocessing.Value("d", 0.0))  # type: ignore[arg-type]
    assert [kind for kind, _ in pipe.sent] == ["ready", "calibrate", "error"]
    timed = pipe.sent[1][1]
    assert [len(timed["a"]), len(timed["b"])] == [7, 2]  # SEQLEN's gears; BATCHSIZE's
    assert [(t, p) for t, p, _ in timed["b"]] == [(2, 2), (8, 8)]  # no SEQLEN: pairs are rows
    assert "KeyError: 'nonsense'" in pipe.sent[-1][1]


def test_command_loop_runs_both_arms_on_their_own_counters(
    namespace: str, tmp_path: object
) -> None:
    config = ControllerConfig(namespace=namespace, state_dir=str(tmp_path))
    controller = embedded.start(config, PolicyConfig())
    which, local = np.array([0, 1, 0, 0, 1, 0, 0, 0]), np.array([0, 0, 1, 2, 1, 3, 4, 5])
    times = np.arange(8, dtype=np.float64)
    profiles = {"a": (DIMS, DIMS, SIZES), "b": (ROWS, ROWS, ROW_SIZES)}
    pipe = Pipe([("calibrate", {"a": DIMS, "b": ROWS}),
                 ("prepare", namespace, profiles, which, local, times),
                 ("slice", "static", 5), ("slice", "adaptive", 2), ("slice", "adaptive", 8),
                 ("settle",), ("finish",), ("exit",)])
    rows, progress = queues(), [0] * 6
    try:
        worker.main(pipe, 0, progress, rows, multiprocessing.Value("d", 0.0))  # type: ignore[arg-type]
    finally:
        assert controller.stop()
    kinds = [kind for kind, _ in pipe.sent]
    assert kinds == ["ready", "calibrate", "prepare", "slice", "slice", "slice", "settle",
                     "finish"], pipe.sent[-1]
    replies = dict(enumerate(value for _, value in pipe.sent))
    counts = [{p: f["requests"] for p, f in replies[i]["profiles"].items()} for i in (3, 4, 5)]
    assert counts == [{"a": 3, "b": 2}, {"a": 1, "b": 1}, {"a": 5, "b": 1}]
    assert (rows[0].value, rows[1].value) == (5, 8)  # each arm's rows, never past the end
    assert progress[0] == 5 and progress[3] == 8  # static at 0, adaptive at 3 * workers
    settled = replies[6]
    assert settled["seconds"] >= 0 and settled["cpu"] >= 0
    assert settled["profiles"]["a"]["requests"] == 0  # the settle's lanes: captures only
    assert not controller.controller.workers  # the client closed at "finish"
