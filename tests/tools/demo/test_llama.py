"""The demo's Llama: both steps through the adaptive runner against the eager model on the
unpadded request, both profiles on one client of one controller, and `demo --model llama` on
both profiles of a source, and on one trace.

Tolerance: float32, `atol = rtol = 1e-5` (observed: at most 2e-7; a padded token or row that
leaked into a real one changes its logits by far more, see the tests' counter-checks)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

pytest.importorskip("transformers")

import gearshift as gs
from gearshift.cli import main
from gearshift.clikit import EXIT_USAGE
from gearshift.controller import embedded
from gearshift.controller.config import ControllerConfig
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim
from gearshift.graphs import AdaptiveRunner, Transform
from gearshift.graphs.backends import CpuBackend
from gearshift.graphs.pool import GraphResourcePool
from gearshift.tools.demo import arm, worker
from gearshift.tools.demo import llama as ll
from gearshift.tools.demo.mix import load_mix

from .test_cli import WAIT, assert_all_gone
from .test_cli import demo as demo_process

TOL = {"atol": 1e-5, "rtol": 1e-5}
PREFILL_DIMS = {"SEQLEN": Dim(gears=[8, 32, 128], max=512)}
DECODE_DIMS = {"BATCHSIZE": Dim(gears=[1, 4, 8], max=16, splittable=True)}


@pytest.fixture(scope="module")
def model() -> ll.Llama:
    torch.set_num_threads(1)
    return ll.Llama(ll.LlamaShape(positions=512, context=16))


def runner(model: ll.Llama, profile: str, dims: dict[str, Dim]) -> AdaptiveRunner:
    fn, inputs, example, outputs = ll.bindings(model, profile)
    transform = Transform(fn, dims, inputs, outputs=outputs)
    r = AdaptiveRunner(transform, example, pool=GraphResourcePool(CpuBackend()))
    gear_dim, = dims
    r.capture([{gear_dim: g} for g in dims[gear_dim].initial_gears])
    return r


def test_weights_are_seeded_and_leave_the_global_rng_alone() -> None:
    shape = ll.LlamaShape(positions=64)
    torch.manual_seed(7)
    before = torch.rand(1)
    torch.manual_seed(7)
    a, b = ll.Llama(shape, seed=1), ll.Llama(shape, seed=1)
    assert torch.equal(torch.rand(1), before)
    x = a.inputs(ll.PREFILL, 5)
    torch.testing.assert_close(a.prefill(**x), b.prefill(**x), atol=0, rtol=0)
    assert not torch.allclose(ll.Llama(shape, seed=2).prefill(**x), a.prefill(**x))


def test_prefill_replays_match_the_eager_model_on_the_unpadded_sequence(model: ll.Llama) -> None:
    r = runner(model, ll.PREFILL, PREFILL_DIMS)
    for n in (5, 31, 100, 300):  # 300: over the largest gear, eager
        x = model.inputs(ll.PREFILL, n, seed=n)
        got = r.run(x)
        assert got.shape == (1, n, model.shape.vocab)
        torch.testing.assert_close(got, model.prefill(**x), **TOL)
    assert r.stats["replays"] == 3 and r.stats["eager"] == 1


def test_prefill_padding_after_the_sequence_is_ignored_but_earlier_tokens_are_not(
    model: ll.Llama,
) -> None:
    x = model.inputs(ll.PREFILL, 9)["input_ids"]
    garbage = torch.cat([x, torch.randint(model.shape.vocab, (1, 7))], dim=1)
    torch.testing.assert_close(model.prefill(garbage)[:, :9], model.prefill(x), **TOL)
    earlier = x.clone()
    earlier[0, 0] = (x[0, 0] + 1) % model.shape.vocab
    assert not torch.allclose(model.prefill(earlier)[0, -1], model.prefill(x)[0, -1], **TOL)


def test_decode_replays_match_the_eager_model_on_the_unpadded_batch(model: ll.Llama) -> None:
    r = runner(model, ll.DECODE, DECODE_DIMS)
    for b in (1, 3, 7, 11):  # 3, 7: padded rows; 11: two chunks, 8 + 4
        x = model.inputs(ll.DECODE, b, seed=b)
        got = r.run(x)
        assert got.shape == (b, 1, model.shape.vocab)
        torch.testing.assert_close(got, model.decode(**x), **TOL)
    assert r.stats["replays"] == 5 and r.stats["eager"] == 0


def test_decode_rows_are_apart_and_the_cache_is_what_prefill_computes(model: ll.Llama) -> None:
    x = model.inputs(ll.DECODE, 3, seed=1)
    batch = model.decode(**x)
    alone = model.decode(x["input_ids"][1:2], x["kv"][:, :, 1:2])
    torch.testing.assert_close(batch[1:2], alone, **TOL)
    assert not torch.allclose(batch[0], batch[1], **TOL)
    context = model.shape.context
    ids = torch.randint(model.shape.vocab, (2, context + 1))
    kv = model.cache(ids[:, :context])
    assert kv.shape == (*x["kv"].shape[:2], 2, *x["kv"].shape[3:])
    step = model.decode(ids[:, context:], kv)
    torch.testing.assert_close(step[:, 0], model.prefill(ids)[:, -1], **TOL)


def test_shipped_sources_give_one_trace_per_profile() -> None:
    loads = load_mix("azure_conv").profiles
    assert list(loads[ll.PREFILL].dims) == ["SEQLEN"]
    assert list(loads[ll.DECODE].dims) == ["BATCHSIZE"]
    with pytest.raises(ValueError, match="SEQLEN only"):
        ll.dims_for(ll.PREFILL, loads[ll.DECODE].dims)


def test_both_profiles_run_through_one_client_of_one_controller(
    model: ll.Llama, namespace: str, tmp_path: object
) -> None:
    loads = load_mix("azure_conv").profiles
    prefill = loads[ll.PREFILL].sizes["SEQLEN"]
    rows = {
        ll.PREFILL: [int(n) for n in prefill[prefill <= 512][:4]],
        ll.DECODE: [int(n) for n in loads[ll.DECODE].sizes["BATCHSIZE"][:4]],
    }
    dims = {ll.PREFILL: PREFILL_DIMS, ll.DECODE: loads[ll.DECODE].dims}
    config = ControllerConfig(namespace=namespace, state_dir=str(tmp_path))
    controller = embedded.start(config, PolicyConfig())
    try:
        with gs.connect(namespace) as client:
            profiles = ll.profiles(client, model, dims)
            for name, sizes in rows.items():
                step = getattr(model, name)
                for i, n in enumerate(sizes):
                    x = model.inputs(name, n, seed=i)
                    torch.testing.assert_close(profiles[name].run(**x), step(**x), **TOL)
    finally:
        assert controller.stop()
    assert controller.controller.counts["folded"] >= 8


# the demo's worker running the Llama (`--model llama`)


def test_the_demo_worker_runs_llama_prefill_and_decode_as_the_eager_model() -> None:
    make, about = worker.model_for("llama")
    assert "LlamaForCausalLM" in about["about"] and about["width"] == ll.LlamaShape.hidden
    demo = make()
    for dims, rows in ((PREFILL_DIMS, (5, 100)), (DECODE_DIMS, (3, 11))):
        r = arm.runner_for(demo, dims)
        r.capture(arm.variants(r.gears))
        for x in arm.inputs(demo, dims, [(n,) for n in rows]):
            torch.testing.assert_close(r.run(x), demo(**x), **TOL)
        assert r.stats["eager"] == 0
    x = torch.randn(3, 1, demo.width)
    torch.testing.assert_close(demo(x)[1:2], demo(x[1:2]), **TOL)  # rows are apart
    assert demo(x[:1]).shape == (1, 1, ll.LlamaShape.vocab)
    with pytest.raises(ValueError, match="expected"):
        demo(torch.randn(2, 3, demo.width))


def test_llama_refuses_a_trace_of_two_dims_before_starting_anything() -> None:
    out = CliRunner().invoke(main, ["demo", "--model", "llama", "--trace", "azure_conv_batched"])
    assert out.exit_code == EXIT_USAGE and "SEQLEN or a BATCHSIZE trace" in out.output


def test_short_llama_decode_demo_reports_both_arms_and_leaves_nothing(namespace: str) -> None:
    proc = demo_process(namespace, "--model", "llama", "--trace", "azure_conv_decode",
                        "--seconds", "10", "--workers", "2", "--json")
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    result = json.loads(out)
    assert "LlamaForCausalLM" in result["model"]["about"]
    adaptive, static = result["adaptive"], result["static"]
    assert adaptive["requests"] == static["requests"] > 0
    assert set(adaptive["dims"]) == {"BATCHSIZE"} and adaptive["snapshot_version"] >= 1
    assert static["replayed_tokens"] == static["padded_tokens"] > static["useful_tokens"]
    assert_all_gone(proc, namespace)


def small_source(directory: Path) -> str:
    """A source of both profiles, `DIR/conv`: the shipped conversation traces' first five
    minutes, prefills of at most 512 tokens and one decode step in 20, so that a short demo
    replays every row (stride 1) and the policy gets its rounds."""
    full = load_mix("azure_conv").profiles
    for profile, dim, keep in ((ll.PREFILL, "SEQLEN", lambda v, i: v <= 512),
                               (ll.DECODE, "BATCHSIZE", lambda v, i: i % 20 == 0)):
        w = full[profile]
        v, t = w.sizes[dim], w.times
        rows = (t < 300) & keep(v, np.arange(len(v)))
        lines = [f"{a:.4f},{b}" for a, b in zip(t[rows], v[rows], strict=True)]
        (directory / f"conv_{profile}.csv").write_text("\n".join([f"t,{dim}", *lines]) + "\n")
    return str(directory / "conv")


def test_short_llama_demo_runs_both_profiles_in_every_worker_and_leaves_nothing(
    namespace: str, tmp_path: Path
) -> None:
    # rounds every 5 s of trace, not 15: some even when a loaded machine makes the stride large
    proc = demo_process(namespace, "--model", "llama", "--trace", small_source(tmp_path),
                        "--seconds", "8", "--workers", "2", "--json",
                        "--set", "update_interval_seconds=5", "--set", "check_interval_seconds=5")
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    result = json.loads(out)
    profiles = result["profiles"]
    assert list(profiles) == [ll.PREFILL, ll.DECODE] and result["trace"] == "conv"
    assert result["requests"] == sum(p["requests"] for p in profiles.values())
    for name, dim in ((ll.PREFILL, "SEQLEN"), (ll.DECODE, "BATCHSIZE")):
        p = profiles[name]
        adaptive, static = p["adaptive"], p["static"]
        assert p["trace"] == f"conv_{name}" and p["requests"] > 0
        assert adaptive["requests"] == static["requests"] == p["requests"]
        assert adaptive["useful_tokens"] == static["useful_tokens"] > 0
        assert set(adaptive["dims"]) == {dim} and adaptive["captures"] > 0
        assert adaptive["captured_tokens"] > 0 and adaptive["adds"] > 0
        assert static["replayed_tokens"] == static["padded_tokens"] > static["useful_tokens"]
        assert static["captures"] == 0 and 0 < adaptive["seconds"] < result["adaptive"]["seconds"]
        assert p["speedup"] == adaptive["useful_tokens_per_second"] / static[
            "useful_tokens_per_second"]
    for arm_ in ("adaptive", "static"):  # the profiles' shares add up to the arm's
        whole = result[arm_]
        assert sum(p[arm_]["seconds"] for p in profiles.values()) == pytest.approx(
            whole["seconds"])
        assert sum(p[arm_]["useful_tokens"] for p in profiles.values()) == whole["useful_tokens"]
        assert set(whole["dims"]) == {"SEQLEN", "BATCHSIZE"}
    assert result["adaptive"]["decision_rounds"]["count"] >= 2
    assert_all_gone(proc, namespace)
