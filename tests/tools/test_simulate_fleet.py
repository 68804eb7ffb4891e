"""`simulate --fleet`: a late node with the fleet starts on its gears and pads its first
interval as the fleet does; cold, it pads as the ladder does."""

from __future__ import annotations

import json

import numpy as np
from click.testing import CliRunner

from gearshift.core.config import PolicyConfig
from gearshift.tools.simulate import Device, policy_dims
from gearshift.tools.simulate_cli import simulate
from gearshift.tools.simulate_fleet import simulate_fleet, tiled
from gearshift.tools.trace import Trace

CONFIG = PolicyConfig()


def _trace(seconds: float = 600.0, rate: float = 4.0) -> Trace:
    rng = np.random.default_rng(7)
    n = int(seconds * rate)
    t = np.sort(rng.uniform(0, seconds, n))
    values = rng.choice([100, 300, 700, 1500], n, p=[0.4, 0.3, 0.2, 0.1])
    return Trace("synthetic", t, {"SEQLEN": values.astype(np.int64)})


def test_tiling_repeats_the_trace_end_to_end() -> None:
    trace = _trace(100.0)
    t, v = tiled(trace, 250.0)
    assert t.size == 3 * trace.events and (np.diff(t) >= 0).all()
    assert (v["SEQLEN"][:trace.events] == trace.dims["SEQLEN"]).all()


def test_a_late_node_with_the_fleet_pads_its_first_interval_as_the_fleet_does() -> None:
    trace = _trace()
    dims = policy_dims(trace, "adaptive")
    result = simulate_fleet(trace, dims, CONFIG, 3, Device(), stagger=300.0, hour=300.0)
    s = result.summary()
    late = s["late_node"]
    assert s["joins"] == [0.0, 300.0, 600.0]
    assert len(late["start_gears"]["fleet"]["SEQLEN"]) < len(late["start_gears"]["cold"]["SEQLEN"])
    first = late["first_interval_cost_overhead"]
    steady = s["steady_state"]["cost_overhead"]
    assert first["fleet"] <= 1.1 * steady and first["cold"] > 2 * first["fleet"]
    assert s["first_interval_within_10_percent"]
    # the fleet's nodes publish, and the late node's cold run never read them
    assert result.nodes[0].published and result.cold.start_gears["SEQLEN"] == dims[
        "SEQLEN"].initial_gears


def test_simulate_fleet_on_the_command_line(tmp_path) -> None:
    trace = _trace(300.0, 2.0)
    path = tmp_path / "t.csv"
    path.write_text("t,SEQLEN\n" + "".join(
        f"{t:.3f},{v}\n" for t, v in zip(trace.t, trace.dims["SEQLEN"], strict=True)))
    slow = ["--set", "check_interval_seconds=120", "--set", "update_interval_seconds=120"]
    out = CliRunner().invoke(simulate, [str(path), "--fleet", "2", "--json", *slow])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["nodes"] == 2
    text = CliRunner().invoke(simulate, [str(path), "--fleet", "2", *slow]).output
    assert "with fleet" in text and "first interval, cost" in text
    refused = CliRunner().invoke(simulate, [str(path), "--fleet", "2", "--policy", "static"])
    assert refused.exit_code == 2 and "adaptive" in refused.output
