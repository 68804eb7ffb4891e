"""`gs.compile` and `Profile.compile`: one call puts a function on compiled gears, made by the
swap thread, measured with their compile seconds and reported; the environment names the
namespace, and a process's compiles share one client. Dynamo's `eager` backend keeps them
cheap (the Inductor path is `tests/graphs/test_compiled.py`'s)."""

from __future__ import annotations

import pytest
import torch

import gearshift as gs
from gearshift.graphs import CompiledRunner
from gearshift.shm import Kind
from gearshift.worker import Client
from worker.fake_controller import FakeController

DIMS = {"SEQLEN": gs.Dim(gears=[4, 16], max=64, splittable=True)}
INPUTS = {"x": ("S", None)}


def fn(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).sin() + 1


def test_one_call_runs_the_function_on_compiled_gears_and_reports_their_cost(
    fake: FakeController, client: Client
) -> None:
    model = gs.compile(fn, DIMS, INPUTS, client=client, backend="eager", lazy_start=False)
    assert model.runner is None and model.profile.name == "fn"
    x = torch.randn(3, 8)
    torch.testing.assert_close(model(x), fn(x))  # before any compile: eager
    runner = model.runner
    assert isinstance(runner, CompiledRunner) and runner.stats["eager"] == 1
    fake.serve()
    client._tick()  # the swap thread compiles both gears, then reports them
    assert runner.ready() == [(4,), (16,)] and runner.stats["compiles"] == 2
    torch.testing.assert_close(model(x=x), fn(x))
    torch.testing.assert_close(model(torch.randn(20, 8)).shape, torch.Size([20, 8]))
    assert runner.stats["replays"] == 3  # 3 rows on 4; 20 rows on 16 + 4
    records = fake.drain(client.slot)
    records = records[records["kind"] == Kind.MEASURED]
    assert sorted(int(r["values"][0]) for r in records) == [4, 16]  # one per graph
    compiled = {c.variant["SEQLEN"]: c.seconds for c in runner.compiles}
    for r in records:  # capture seconds (ns on the ring) hold the compile's
        assert r["values"][1] >= int(compiled[int(r["values"][0])] * 1e9)
    with pytest.raises(gs.ShapeError, match="given twice"):
        model(x, x=x)
    model.close()  # the client was the caller's: still open
    assert client.profile("fn", DIMS) is model.profile


def test_the_namespace_comes_from_the_environment_and_one_client_is_shared(
    namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GEARSHIFT_NAMESPACE", namespace)
    example = {"x": torch.zeros(1, 8)}
    first = gs.compile(fn, DIMS, INPUTS, example, backend="eager")
    second = gs.compile(lambda x: x + 1, DIMS, INPUTS, example, name="plus", backend="eager")
    try:
        assert first.client is second.client and first.client.namespace == namespace
        assert first.runner is not None  # the example attached it at once
    finally:
        first.close()
        first.close()  # idempotent: the second still holds the client ...
    third = gs.compile(lambda x: x - 1, DIMS, INPUTS, example, name="minus", backend="eager")
    assert third.client is second.client  # ... and shares it still
    second.close()
    third.close()  # the last user: the client is closed, the next compile makes another
    again = gs.compile(fn, DIMS, INPUTS, example, name="again", backend="eager")
    try:
        assert again.client is not second.client
    finally:
        again.close()


def test_twin_models_get_profiles_of_their_own(fake: FakeController, client: Client) -> None:
    """Two models of one class (a draft and a target) each keep their own profile and runner:
    the second's profile is named `Linear.2`, so `status` tells them apart; an explicit name
    another function holds is refused (before: one profile, and `c1(x)` gave `c2`'s output)."""
    torch.manual_seed(0)
    dims = {"SEQLEN": gs.Dim(gears=[4, 16], max=64)}
    one, two = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    inputs = {"input": ("S", None)}
    c1 = gs.compile(one, dims, inputs, client=client, backend="eager")
    c2 = gs.compile(two, dims, inputs, client=client, backend="eager")
    assert (c1.profile.name, c2.profile.name) == ("Linear", "Linear.2")
    x = torch.randn(3, 8)
    with torch.no_grad():
        want1, want2 = one(x), two(x)
    torch.testing.assert_close(c2(x), want2)
    torch.testing.assert_close(c1(x), want1)
    fake.serve()
    client._tick()
    torch.testing.assert_close(c1(x), want1)
    torch.testing.assert_close(c2(x), want2)
    same = gs.compile(one, dims, inputs, client=client, backend="eager")
    assert same.profile is c1.profile  # the same function shares its profile
    with pytest.raises(gs.ConfigError, match="name"):
        gs.compile(two, dims, inputs, client=client, backend="eager", name="Linear")
    c1.close()
    same.close()  # the name is free again once its last user closes
    three = gs.compile(torch.nn.Linear(8, 8), dims, inputs, client=client, backend="eager")
    assert three.profile.name == "Linear"
    c2.close()
    three.close()
