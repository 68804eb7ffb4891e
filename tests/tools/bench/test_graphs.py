"""`gearshift bench graphs` on the cpu backend (every figure but memory), its memory figures
on the fake device (tests/graphs/fake_device.py), and the 2-worker adoption path."""

from __future__ import annotations

import json
import os

import torch
from click.testing import CliRunner
from graphs.fake_device import FakeCuda

from gearshift.tools.bench.graphs import (
    RELEASED,
    Probe,
    capture_all,
    command,
    latency,
    make_runner,
    memory,
    shared_pool,
)
from gearshift.tools.bench.graphs_adoption import adoption
from gearshift.tools.bench.graphs_model import BATCH, SEQ, Model
from gearshift.tools.bench.tables import TABLES


def test_bench_graphs_on_the_cpu_backend_reports_every_figure() -> None:
    args = ["--device", "cpu", "--quick", "--seconds", "1", "--no-adoption", "--json"]
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 0, result.output
    r = json.loads(result.output)
    assert r["graphs"] == len(BATCH) * len(SEQ) == r["checked"]
    assert r["mismatches"] == 0 and r["errors"] == 0 and r["max_abs_error"] < 1e-4
    assert set(r["speed"]) == {"1", "4", "16", "64"}
    assert all(d["speedup"] == d["eager_us"] / d["graph_us"] for d in r["speed"].values())
    lat = r["latency"]
    assert lat["idle"]["requests"] > 0 and lat["capturing"]["requests"] > 0
    assert lat["churn_captures"] > 0 and lat["churn_errors"] == 0
    assert r["graph_bytes_total"] is None and r["released_graphs"] == len(RELEASED) * len(SEQ)
    rows = TABLES["graphs"](r)
    assert rows[0][0].startswith("decode batch 1") and len(rows) == 4 + 1 + 2 + 1


def test_the_memory_figures_on_the_fake_device() -> None:
    """Every block multiplies through a 32 MiB cuBLAS workspace (sm90's): the graphs' bytes are
    their activations (the kept workspace is the backend's), and a release returns them."""
    fake = FakeCuda(total=1 << 34)
    backend = fake.backend()
    model = Model(32, 2, 2, "cpu", op=fake.blas)
    probe = Probe(backend)
    runner = make_runner(model, backend, "cpu")
    held = capture_all(runner, probe)
    assert all(0 < n < 8 << 20 for _, n in held.values())
    m = memory(runner, probe, held)
    assert m["released_graphs"] == len(RELEASED) * len(SEQ)
    assert m["memory_returned_bytes"] == m["released_graph_bytes"] > 0
    base = shared_pool(model, backend, "cpu")
    assert base["shared_pool_returned_bytes"] <= 4 << 20  # the graphs' execs: the pool stays
    assert 0 < base["shared_pool_bytes"] < sum(n for _, n in held.values())
    x = torch.randn(5, 1, 32)
    torch.testing.assert_close(runner.run({"x": x}), model(x))


def test_two_workers_adopt_new_gears_on_one_device() -> None:
    a = adoption("cpu", (32, 1, 2), quick=True)
    assert a["versions_acked"] == a["versions_wanted"] == 2 and a["errors"] == 0
    # Both acked two new versions: they adopted them. Whether the gears end away from the
    # ladder is the policy's business (priced on the graphs measured, it may move them back,
    # or only later), so it is not asserted here; the gears are the device's, in bounds.
    for w in a["per_worker"]:
        assert w["requests"] > 0 and w["captures"] > 0 and w["graphs"] > 0 and w["replays"] > 0
        assert 1 <= min(w["gears"]["BATCHSIZE"]) <= max(w["gears"]["BATCHSIZE"]) <= max(BATCH)
    assert not [n for n in os.listdir("/dev/shm") if f"bench-graphs-{os.getpid()}" in n]


def test_requests_beside_captures_on_the_fake_device_break_nothing() -> None:
    """The strict fake voids a capture on any device synchronize and refuses replays and
    sampling during one: the latency phase waits for its stream and the capture window."""
    fake = FakeCuda(total=1 << 34)
    backend = fake.backend()
    model = Model(32, 2, 2, "cpu", op=fake.op)
    probe = Probe(backend)
    runner = make_runner(model, backend, "cpu")
    runner.capture([{"BATCHSIZE": b, "SEQLEN": 1} for b in BATCH])
    lat = latency(runner, model, probe, "cpu", 0.6)
    assert lat["churn_captures"] > 0 and lat["churn_errors"] == 0
    for phase in ("idle", "capturing"):
        assert lat[phase]["requests"] > 0 and lat[phase]["errors"] == lat[phase]["wrong"] == 0
    assert fake.calls["stream_synchronize"] >= lat["capturing"]["requests"]
    assert backend.stats["capture_failures"] == 0
