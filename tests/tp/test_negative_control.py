"""The negative control: the harness sees the hazard that groups remove. The same two gloo
ranks as ungrouped gearshift profiles (each rank a worker of its own device, decided per
device by a controller deciding every 0.5 s, adopting on its own time, warming up and
capturing on its own swap thread while its request thread is inside the step's all-reduces)
must fail, hang, replay different gears at one step, or give a wrong output, within the
test's deadline.

Which shows depends on the threads' timing (a warm-up's all-reduce on one rank against a
step's on the other: gloo refuses the mismatched sizes, or waits, or, where the sizes happen to
match, each sums the other's data into its own; or one rank's runner runs a chunk eagerly or
on a larger gear while the other's graph is ready); the test accepts any and fails only when
every step of every rank was served on the same gear and gave the unsharded block's output."""

from __future__ import annotations

from multiprocessing.context import BaseContext
from pathlib import Path

from tp import ranks
from tp.launch import controller, run_ranks

STEPS = 400
DEADLINE = 45.0
WRONG = 1e-6  # a relative error no float64 rounding reaches (grouped runs stay under 1e-10)


def test_ungrouped_ranks_fail_hang_or_differ_under_a_controller_deciding_often(
    mp: BaseContext, namespace: str, tmp_path: Path
) -> None:
    with controller(namespace, tmp_path, "check_interval_seconds=0.5",
                    "update_interval_seconds=0.5"):
        out = run_ranks(mp, ranks.ungrouped, 2, (11, STEPS, namespace, 0.01),
                        deadline=DEADLINE)
    failed = out.hung or any(code != 0 for code in out.exitcodes) or out.of("error")
    differed = out.of("step")
    wrong = [d for d in out.of("done") if d[3] > WRONG]  # ("done", rank, steps, worst, ...)
    assert failed or differed or wrong, f"the hazard did not show: {out.reports}"
