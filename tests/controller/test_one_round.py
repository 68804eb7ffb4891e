"""One decision round: the simulator and a controller fed the same events in fake time
publish the same gears after every check."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fakeclock import FakeClock

from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller
from gearshift.core.config import PolicyConfig
from gearshift.tools.simulate import policy_dims, simulate
from gearshift.tools.trace import Trace

from .workers import Worker

# The controller's clock starts at trace time 0, and every time is a whole number of
# nanoseconds: the controller reads the events' times (t_ns * 1e-9) exactly as the simulator
# reads the trace, and checks fall on multiples of 0.25 s, exact in binary.


def _trace(seed: int) -> Trace:
    """Twenty trace minutes (20 s here) of batch sizes that move from small to large."""
    rng = np.random.default_rng(seed)
    t = np.sort(rng.integers(0, 20 * 10**9, 6000)) * 1e-9
    t[0] = 0.0
    centre = np.where(t < 10.0, 6.0, 30.0)
    sizes = np.clip(np.rint(rng.normal(centre, centre / 3)), 1, 48).astype(np.int64)
    return Trace("drift", t, {"BATCHSIZE": sizes})


@pytest.mark.parametrize("mode", ["plan", "rules"])
def test_the_simulator_and_a_controller_publish_the_same_gears(
    mode: str, namespace: str, tmp_path: Path
) -> None:
    policy = PolicyConfig(policy_mode=mode, add_min_samples=3).scaled(60.0)  # minutes to s
    trace = _trace(7)
    dims = policy_dims(trace, "adaptive")
    expected = simulate(trace, dims, policy).dims["BATCHSIZE"].gears  # per segment

    clock = FakeClock(0.0)
    config = ControllerConfig(namespace=namespace, state_dir=str(tmp_path))
    controller = Controller.open(config, policy, clock=clock)
    worker = Worker(namespace, 0, clock, capacity=1 << 14)
    try:
        worker.register(0, "trace", dims, serve=controller.step)  # the first round, at 0
        published = [worker.gears("trace")["BATCHSIZE"]]
        times, sizes = trace.t, trace.dims["BATCHSIZE"]
        sent = 0
        for k in range(1, len(expected)):
            check = k * policy.check_interval_seconds
            while sent < len(times) and times[sent] < check:  # the segment before the check
                assert worker.put(0, int(sizes[sent]), t=float(times[sent]))
                sent += 1
            clock.advance(check - clock.now())  # exact: both are multiples of 0.25
            controller.step()
            published.append(worker.gears("trace")["BATCHSIZE"])
    finally:
        worker.close()
        controller.close()
    assert len(set(expected)) > 1  # the gears moved: the rounds had something to decide
    assert published == list(expected)
