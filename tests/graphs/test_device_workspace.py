"""The workspace designs compared on the fake device (tests/graphs/fake_device.py: sm90's 32 MiB
cuBLAS workspace per (handle, stream)), with the bench's graphs (`gearshift bench graphs`' model
and gears): the bytes each graph takes of the device beyond its activations, and whether a
release gives them back. `python tests/graphs/test_device_workspace.py` prints the figures
(docs/benchmarks.md, "Graph memory on the fake device")."""

from __future__ import annotations

import json
import statistics
from typing import Any

import pytest

from gearshift.graphs import device as device_module
from gearshift.tools.bench.graphs import Probe, capture_all, make_runner, memory, shared_pool
from gearshift.tools.bench.graphs_model import Model
from graphs.fake_device import FakeCuda, MiB

DESIGNS = {  # name: (the backend's design, workspace bytes)
    "kept": ("kept", 32 * MiB),
    "per_graph": ("per_graph", 32 * MiB),
    "per_graph, CUBLAS_WORKSPACE_CONFIG=:4096:1": ("per_graph", 4 * MiB),
    "per_graph, CUBLAS_WORKSPACE_CONFIG=:1024:1": ("per_graph", 1 * MiB),
}
TARGET = 8 * MiB  # beyond its activations, per graph


def _graphs(design: str, workspace: int, blas: bool = True, few: bool = False) -> dict[str, Any]:
    """The bench's graphs (`few`: four of them), each captured alone: its pool's bytes
    (`pool`), the device's free memory it took (`took`), the backend's bytes beyond them
    (`fixed`), and a release's return against what its graphs took."""
    fake = FakeCuda(total=1 << 36, workspace=workspace)
    backend = fake.backend(design=design)
    model = Model(32, 2, 2, "cpu", op=fake.blas if blas else fake.op)
    probe = Probe(backend)
    runner = make_runner(model, backend, "cpu")
    free0 = probe.free()
    held = _capture_few(runner, probe) if few else capture_all(runner, probe)
    took = [n for _, n in held.values()]
    pool = [c.graph_bytes for _, c in runner.take_measurements()][1:]  # the first: released
    fixed = free0 - probe.free() - sum(took)
    if few:
        before = probe.free()
        released = sum(runner.release("BATCHSIZE", b) for b in (16, 4))
        gap = probe.free() - before - sum(n for (b, _), (_, n) in held.items() if b in (16, 4))
        assert released == 2
    else:
        m = memory(runner, probe, held)
        gap = m["memory_returned_bytes"] - m["released_graph_bytes"]
    device_module._STUCK.clear()
    return {"pool": pool, "took": took, "fixed": fixed, "returned_minus_held": gap}


def _capture_few(runner: Any, probe: Probe) -> dict[tuple[int, int], tuple[float, Any]]:
    """As `capture_all`, four graphs: a first one released (the lasting state), then each."""
    runner.capture([{"BATCHSIZE": 1, "SEQLEN": 16}])
    runner.release("SEQLEN", 16)
    out = {}
    for b in (64, 16, 4, 1):
        before = probe.free()
        runner.capture([{"BATCHSIZE": b, "SEQLEN": 1}])
        out[b, 1] = (0.0, before - probe.free())
    return out


def _generation(workspace: int) -> dict[str, Any]:
    """Every graph in one pool (the bench's baseline, as vllm-omni pools a generation)."""
    fake = FakeCuda(total=1 << 36, workspace=workspace)
    model = Model(32, 2, 2, "cpu", op=fake.blas)
    out = shared_pool(model, fake.backend(design="per_graph"), "cpu")
    device_module._STUCK.clear()
    return out


def figures(designs: tuple[str, ...] = tuple(DESIGNS), few: bool = False,
            ) -> dict[str, dict[str, Any]]:
    """Per design, in MiB: a graph's pool beyond its activations (mean, max), the device's free
    memory a graph took (mean), the backend's once (`fixed`), the bench's graphs in all, and
    a release's return less what its graphs took. In one pool per generation the graphs share
    their activations and one workspace; a release returns nothing until the generation's last
    graph goes."""
    bare = _graphs("kept", 32 * MiB, blas=False, few=few)["pool"]  # activations alone
    out: dict[str, dict[str, Any]] = {}
    for name in designs:
        g = _graphs(*DESIGNS[name], few=few)
        over = [n - a for n, a in zip(g["pool"], bare, strict=True)]
        out[name] = {"graphs": len(g["pool"]),
                     "pool_over_activations_mean": _mib(statistics.mean(over)),
                     "pool_over_activations_max": _mib(max(over)),
                     "took_mean": _mib(statistics.mean(g["took"])), "fixed": _mib(g["fixed"]),
                     "total": _mib(sum(g["took"]) + g["fixed"]),
                     "returned_minus_held": _mib(g["returned_minus_held"])}
    if few:
        return out
    gen = _generation(32 * MiB)
    out["one pool per generation"] = {
        "graphs": len(bare), "total": _mib(gen["shared_pool_bytes"]),
        "returned_of_half": _mib(gen["shared_pool_returned_bytes"])}
    out["activations"] = {"graphs": len(bare), "mean": _mib(statistics.mean(bare)),
                          "total": _mib(sum(bare))}
    return out


def _mib(n: float) -> float:
    return round(n / MiB, 2)


@pytest.fixture(scope="module")
def measured() -> dict[str, dict[str, Any]]:
    return figures(("kept", "per_graph"), few=True)


def test_the_kept_workspace_costs_a_graph_no_more_than_its_activations_and_8_mib(
    measured: dict[str, dict[str, Any]],
) -> None:
    kept, per_graph = measured["kept"], measured["per_graph"]
    assert kept["pool_over_activations_max"] <= TARGET / MiB
    assert per_graph["pool_over_activations_mean"] >= 30  # 32 MiB in every graph's pool
    assert 32 <= kept["fixed"] <= 2 * 32 + 4  # the capture's and the warm-ups', once
    assert kept["took_mean"] <= TARGET / MiB  # the device's free memory a graph took, too


def test_with_the_kept_workspace_a_release_returns_what_its_graphs_took(
    measured: dict[str, dict[str, Any]],
) -> None:
    assert abs(measured["kept"]["returned_minus_held"]) <= 2, measured["kept"]


if __name__ == "__main__":
    print(json.dumps(figures(), indent=1))
