"""The demo's compile backend in this process: compiled gears of the block (and the Llama)
against the eager model, tokens counted outside the compiled code, the demo's own cache.

Dynamo's `eager` backend keeps these fast (Dynamo traces and guards as with Inductor; the
graphs run eagerly); Inductor's gears are checked against eager in tests/graphs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch._inductor.config as inductor

from gearshift.core.dims import Dim
from gearshift.tools.demo import arm, compiled
from gearshift.tools.demo.block import Model
from gearshift.worker import compile_cache

DIMS = {"SEQLEN": Dim(gears=[4, 8], max=8)}
TOLERANCE = {"atol": 1e-5, "rtol": 1e-5}  # float32; the padded shape's kernels, not eager's


def runner(m: Model, lock_dir: str | None = None) -> compiled.CompiledRunner:
    return compiled.CompiledRunner(m, DIMS, "eager", lock_dir)


def test_compiled_gears_match_the_eager_model_on_the_unpadded_input() -> None:
    m = Model(width=16, heads=2)
    r = runner(m)
    r.capture(arm.variants(r.gears))
    assert r.stats["compiles"] == 2 and r.graph_breaks == []  # one full graph per gear
    for n in (1, 3, 4, 5, 8):  # padded to 4 or 8, or a gear itself
        x = torch.randn(n, 16)
        torch.testing.assert_close(r.run({"x": x}), m(x), **TOLERANCE)
    assert r.stats["replays"] == 5 and r.stats["eager"] == 0


def test_tokens_are_counted_outside_the_compiled_code() -> None:
    m = Model(width=16, heads=2)
    r = runner(m)
    checked = m.tokens  # the padding check ran the model's counted __call__ on a probe
    r.capture([{"SEQLEN": 8}])
    # the compile ran it once, then the capture timed and checked the graph: all counted
    assert r.capture_tokens == m.tokens - checked >= 8 and r.here() == r.capture_tokens
    assert r.capture_seconds > 0
    r.run({"x": torch.randn(5, 16)})  # a request on gear 8 is no capture
    assert m.tokens == checked + r.capture_tokens + 8


def test_the_cache_is_the_demos_own_and_every_compile_takes_its_shape_lock(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", "/nonexistent")  # restored after; the demo's wins
    monkeypatch.setenv(compile_cache.CACHE_ENV, "/nonexistent/inductor")
    with inductor.patch(compile_threads=inductor.compile_threads):  # restored after
        locks = compiled.prepare_cache("demo-1", str(tmp_path))
        assert inductor.compile_threads == 1  # compiled in the worker: its CPU time counts
    assert locks == str(tmp_path / "gearshift" / "demo-1" / "locks")
    assert os.environ[compile_cache.CACHE_ENV] == str(tmp_path / "gearshift" / "demo-1"
                                                      / "inductor")
    first, second = runner(Model(width=16, heads=2), locks), runner(Model(width=16, heads=2),
                                                                     locks)
    first.capture([{"SEQLEN": 4}])
    assert len(list(Path(locks).glob("*.done"))) == 1  # compiled once on the node...
    second.capture([{"SEQLEN": 4}])  # ... so the other loads it, without waiting
    assert len(list(Path(locks).glob("*.done"))) == 1
    assert second.compiles[0].waited == 0.0


def test_llama_prefill_and_decode_gears_match_the_eager_model_on_the_unpadded_input() -> None:
    llama = pytest.importorskip("gearshift.tools.demo.llama")
    pytest.importorskip("transformers")
    m = llama.DemoLlama()
    for dims, x in (({"SEQLEN": Dim(gears=[8], max=8)}, torch.randn(5, m.width)),
                    ({"BATCHSIZE": Dim(gears=[4], max=4, splittable=True)},
                     torch.randn(3, 1, m.width))):
        r = compiled.CompiledRunner(m, dims, "eager", None)
        r.capture(arm.variants(r.gears))
        assert r.stats["compiles"] == 1 and r.graph_breaks == []
        torch.testing.assert_close(r.run({"x": x}), m(x), **TOLERANCE)
