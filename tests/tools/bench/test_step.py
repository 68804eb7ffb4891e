"""`gearshift bench step`: its static dispatcher, and a short run's figures and cleanup."""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import torch
from click.testing import CliRunner

from gearshift.graphs.backends import get_backend
from gearshift.tools.bench.step import GEARS, PROFILES, StaticDispatcher, command, fn


def test_the_static_dispatcher_replays_the_smallest_gear_that_fits_and_zeroes_its_padding(
) -> None:
    seen = []

    def graph_fn(b: int, view: torch.Tensor) -> Callable[[], torch.Tensor]:
        def body() -> torch.Tensor:
            seen.append((b, view[:, 0].tolist()))
            return fn(view)
        return body

    static = StaticDispatcher(get_backend("cpu", 0), GEARS, graph_fn)
    seen.clear()
    static(torch.full((9, 16), 5.0))
    x = torch.ones(3, 16)
    assert torch.equal(static(x), fn(x))
    assert seen[-1] == (4, [1.0, 1.0, 1.0, 0.0])  # gear 4; the 9-row call's row 4 zeroed


def test_bench_reports_every_arm_and_leaves_no_segment() -> None:
    result = CliRunner().invoke(command, ["--batches", "2", "--batch", "20",
                                          "--idle-seconds", "0.2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    for arm in ("static", "static_compiled", *(f"{p}_{c}" for p in PROFILES
                                               for c in ("live", "quiet", "adopting"))):
        assert data[f"{arm}_wall_us"] > 0 and data[f"{arm}_cpu_us"] > 0, arm
    assert len(data["runner_live_minus_static_cpu_us_range"]) == 2
    # model(x) reaches the replay in three gearshift frames: CompiledModel.__call__, Profile.run,
    # AdaptiveRunner.run; profile.run in two
    assert data["compile_gearshift_frames_at_replay"] == 3
    assert data["runner_gearshift_frames_at_replay"] == 2
    assert 0 < data["runner_gearshift_calls_per_step"] < data["compile_gearshift_calls_per_step"]
    # the common step's calls: Profile.run, Transform.check, the snapshot's version, the route
    # and its ring write, AdaptiveRunner.run, StaticBuffers.check, the replay section's enter
    # and exit, the replay (24 before copy plans, the one-pass checks and one graph partial)
    assert data["runner_gearshift_calls_per_step"] <= 11  # 10 when written
    assert 0 <= data["idle_swap_thread_cpu_per_s"] < 1
    assert 0 <= data["idle_controller_cpu_per_s"] < 1
    assert not [n for n in os.listdir("/dev/shm") if f"bench-step-{os.getpid()}" in n]


def test_cold_runs_a_models_step_between_steps_and_times_each_step_apart() -> None:
    from gearshift.tools.bench.step import Between, _batch

    between, calls = Between(), []
    steps = [torch.zeros(1, 16)] * 3
    inner = between.model.forward
    between.model.forward = lambda x: calls.append("model") or inner(x)  # type: ignore[method-assign]
    wall, cpu, thread = _batch(lambda x: calls.append("step"), steps, between)
    assert calls == ["model", "step"] * 3  # the model's step before each timed step
    assert wall > 0 and 0 <= thread <= cpu + 1e6
    result = CliRunner().invoke(command, ["--batches", "1", "--batch", "5", "--idle-seconds",
                                          "0.1", "--cold", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["cold"] is True and data["runner_live_cpu_us"] > 0
