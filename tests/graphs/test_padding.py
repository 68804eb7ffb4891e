"""The padding contract: a function whose result would change with the padding is refused
(symbolically at construction, by a padded probe at construction and once per graph), one
that declares how it handles padding (`lengths=`, `handles_padding=`) is exact."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch

import gearshift as gs
from gearshift.graphs import AdaptiveRunner, Transform, padding
from gearshift.graphs.backends import CpuBackend
from gearshift.graphs.pool import GraphResourcePool

H = 8
torch.manual_seed(0)
LAYER = torch.nn.Linear(H, H)
SEQ = {"SEQLEN": gs.Dim(gears=[4, 16, 64], max=64)}


@torch.no_grad()
def m(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(LAYER(x))


def runner(fn: Callable[..., Any], **options: Any) -> AdaptiveRunner:
    transform = Transform(fn, SEQ, inputs={"x": ("S", None)}, **options)
    return AdaptiveRunner(transform, {"x": torch.zeros(1, H)},
                             pool=GraphResourcePool(CpuBackend()))


def captured(r: AdaptiveRunner) -> AdaptiveRunner:
    r.capture([{"SEQLEN": g} for g in r.gears["SEQLEN"]])
    return r


def written_through_a_view(x: torch.Tensor) -> torch.Tensor:
    y = torch.zeros(2, H)
    y[0].add_(x.sum(0))  # y itself reads nothing: what its view is written with, it reads
    return y


@pytest.mark.parametrize(
    ("fn", "options"),
    [
        (written_through_a_view, {}),  # exact on the probe's padding: only the trace refuses it
        (lambda x: m(x)[-1], {}),  # the last token
        (lambda x: m(x).mean(0), {}),  # a mean pool
        (lambda x: m(x)[-1], {"outputs": (None,)}),  # declaring outputs changes nothing
        (lambda x: (m(x), m(x)[-1:]), {}),  # a per-row output does not excuse the other
    ],
)
def test_a_reduction_over_the_padded_axis_is_refused_with_the_fix(
    fn: Callable[..., Any], options: dict[str, Any]
) -> None:
    with pytest.raises(gs.PaddingError, match="has no SEQLEN axis, yet it reads x") as e:
        runner(fn, **options)
    assert "select after run()" in str(e.value) and "lengths={'n': 'S'}" in str(e.value)


def test_declared_lengths_make_the_last_token_and_the_mean_exact() -> None:
    last = captured(runner(lambda x, n: m(x)[n - 1], lengths={"n": "S"}))
    arange = torch.arange

    def mean(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        return (m(x) * (arange(x.shape[0]) < n)[:, None]).sum(0) / n

    pool = captured(runner(mean, lengths={"n": "S"}))
    for s in (1, 3, 5, 16, 17, 64):
        x = torch.randn(s, H)
        torch.testing.assert_close(last.run({"x": x}), m(x)[-1:])
        torch.testing.assert_close(pool.run({"x": x}), m(x).mean(0))
    assert last.stats["replays"] == pool.stats["replays"] == 6
    assert last.stats["eager"] == 0 and last.refused is None


def test_bad_declarations_are_named() -> None:
    with pytest.raises(gs.ShapeError, match=r"lengths\['x'\] must name a symbol"):
        runner(lambda x: x, lengths={"x": "S"})
    with pytest.raises(gs.ShapeError, match=r"lengths\['n'\] axis 0: unknown symbol 'T'"):
        runner(lambda x, n: x, lengths={"n": "T"})
    with pytest.raises(gs.ShapeError, match="handles_padding axis 0: unknown symbol 'T'"):
        runner(lambda x: x, handles_padding="T")


def test_a_mask_the_function_reads_is_declared_with_handles_padding() -> None:
    def pooled(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return (m(x) * mask[:, None]).sum(0)  # the mask pads with 0: the sum is exact

    inputs = {"x": ("S", None), "mask": ("S",)}
    with pytest.raises(gs.PaddingError):
        Transform(pooled, SEQ, inputs=inputs)({"x": torch.ones(2, H), "mask": torch.ones(2)})
    t = Transform(pooled, SEQ, inputs=inputs, handles_padding=("S",))
    r = AdaptiveRunner(t, {"x": torch.zeros(1, H), "mask": torch.ones(1)},
                          pool=GraphResourcePool(CpuBackend()))
    captured(r)
    x, mask = torch.randn(5, H), torch.ones(5)
    torch.testing.assert_close(r.run({"x": x, "mask": mask}), pooled(x, mask))
    assert r.stats["replays"] == 1


def test_row_wise_functions_stay_exact() -> None:
    r = captured(runner(lambda x: m(x) * 2))
    for s in (1, 3, 16, 33):
        x = torch.randn(s, H)
        torch.testing.assert_close(r.run({"x": x}), m(x) * 2)
    assert r.stats["replays"] == 4 and r.refused is None


def test_padding_that_changes_real_rows_is_refused_by_the_probe() -> None:
    def attention(x: torch.Tensor) -> torch.Tensor:  # every position sees every other one
        return torch.softmax(m(x) @ m(x).T, -1) @ x

    with pytest.raises(gs.PaddingError, match="does not give, cut back, what it gives"):
        runner(attention)
    causal = runner(lambda x: torch.nn.functional.scaled_dot_product_attention(
        m(x)[None], m(x)[None], x[None], is_causal=True)[0])
    x = torch.randn(5, H)
    want = torch.nn.functional.scaled_dot_product_attention(
        m(x)[None], m(x)[None], x[None], is_causal=True)[0]
    torch.testing.assert_close(captured(causal).run({"x": x}), want)


def test_a_graph_that_fails_the_probe_is_dropped_and_calls_run_eagerly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def mixes_from_9(x: torch.Tensor) -> torch.Tensor:  # exact at the construction probe (4)
        return x + x.sum(0) if x.shape[0] > 8 else x

    r = runner(mixes_from_9)
    with caplog.at_level(logging.WARNING, "gearshift"):
        assert r.capture([{"SEQLEN": 16}]) == 0  # probed with 8 rows: 16 of them mix
        assert r.capture([{"SEQLEN": 4}, {"SEQLEN": 64}]) == 0  # none after it
    assert r.refused is not None and "padded from {'SEQLEN': 8}" in r.refused
    assert r.ready() == [] and len(r.pool) == 0
    assert sum("runs eagerly on its unpadded inputs" in m.message for m in caplog.records) == 1
    for s in (3, 12):
        x = torch.randn(s, H)
        torch.testing.assert_close(r.run({"x": x}), mixes_from_9(x))
    assert r.stats["eager"] == 2 and r.stats["replays"] == 0


def test_each_gear_is_probed_once() -> None:
    calls = []

    def counted(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return m(x)

    r = AdaptiveRunner(Transform(counted, SEQ, inputs={"x": ("S", None)}),
                          {"x": torch.zeros(1, H)}, pool=GraphResourcePool(CpuBackend()),
                          replays=0)
    calls.clear()  # the trace and the construction probe
    r.capture([{"SEQLEN": 16}])
    # the capture, on the probe padded (a cpu graph's capture runs fn: its output is the
    # probe's, so no replay), then fn on the probe unpadded
    assert calls == [16, 8]
    r.release("SEQLEN", 16)
    r.capture([{"SEQLEN": 16}])
    assert calls == [16, 8, 16]  # captured again, not probed again


def test_trace_finds_what_each_output_reads_through_views_and_writes() -> None:
    def f(x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.zeros(H)
        y.add_(x[-1])  # written in place: y reads x
        return scale * 2, y, torch.full((3,), x.shape[0]), torch.zeros(2)

    t = Transform(f, SEQ, inputs={"x": ("S", None), "scale": (None,)})
    fakes = t._fakes({"x": torch.zeros(3, H), "scale": torch.zeros(H)})
    leaves, _ = padding.trace(f, fakes)
    assert [set(leaf.reads) for leaf in leaves] == [{"scale"}, {"x"}, {"x"}, set()]


def test_mismatch_is_exact_on_integers_and_relative_on_floats() -> None:
    a = torch.randn(4, 3) * 100
    assert padding.mismatch([a, torch.arange(3)], [a + 1e-4, torch.arange(3)]) is None
    assert "differs by up to" in str(padding.mismatch([a], [a + 1.0]))
    assert "differs in 1 of 3" in str(padding.mismatch([torch.tensor([1, 2, 3])],
                                                       [torch.tensor([1, 2, 4])]))
    nan = torch.tensor([float("nan"), 1.0])
    assert padding.mismatch([nan], [nan.clone()]) is None
    assert padding.mismatch([nan], [torch.ones(2)]) is not None
    assert "is (2,)" in str(padding.mismatch([torch.ones(2)], [torch.ones(3)]))


def test_a_function_that_writes_state_outside_its_inputs_is_refused_and_left_alone() -> None:
    """A decode step writing a static cache held outside it (the HF "static cache" pattern):
    gearshift's own runs (trace, probes, warm-ups, measuring replays) would write junk into
    it, so `runner()` refuses it, naming the tensor, and leaves it untouched (before: no
    refusal, and the cache was already changed when `runner()` returned)."""
    cache = torch.zeros(16, H)  # one row of state per batch row, kept between steps

    def step(x: torch.Tensor) -> torch.Tensor:
        cache[: x.shape[0]] += x
        return torch.tanh(LAYER(cache[: x.shape[0]]))

    dims = {"BATCHSIZE": gs.Dim(gears=[4, 16], max=16)}
    transform = Transform(step, dims, inputs={"x": ("B", None)})
    with pytest.raises(gs.PaddingError, match=r"step writes cache .* neither one of its inputs"):
        AdaptiveRunner(transform, {"x": torch.ones(3, H)}, pool=GraphResourcePool(CpuBackend()))
    assert not cache.any()

    def pure(x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        new = state + x  # the fix: the new state is an output, the caller writes it
        return torch.tanh(LAYER(new)), new

    transform = Transform(pure, dims, inputs={"x": ("B", None), "state": ("B", None)})
    served = AdaptiveRunner(transform, {"x": torch.ones(3, H), "state": cache[:3]},
                               pool=GraphResourcePool(CpuBackend()))
    served.capture([{"BATCHSIZE": 16}, {"BATCHSIZE": 4}])
    plain = torch.zeros(16, H)
    for _ in range(3):  # the decode loop, against the same loop run eagerly
        x = torch.randn(3, H)
        y, cache[:3] = served.run({"x": x, "state": cache[:3]})
        want, plain[:3] = pure(x, plain[:3])
        torch.testing.assert_close(y, want)
    torch.testing.assert_close(cache, plain)
    assert served.stats["replays"] == 3

    train = torch.nn.BatchNorm1d(H)  # a model left in train mode updates its statistics

    def normed(x: torch.Tensor) -> torch.Tensor:
        return train(x)

    with pytest.raises(gs.PaddingError, match=r"writes train\..* train mode"):
        runner(normed)
    assert not train.running_mean.any()


@pytest.mark.parametrize(("fn", "what"), [(lambda x: None, "returns None"),
                                          (lambda x: float(x.shape[0]), "returns a float")])
def test_an_output_that_is_not_a_tensor_says_so(fn: Callable[..., Any], what: str) -> None:
    with pytest.raises(gs.ShapeError, match=what) as e:
        runner(fn)
    assert "outputs=" not in str(e.value)  # declaring them would not help
    with pytest.raises(gs.ShapeError, match=what):  # nor does it: the same reason
        runner(fn, outputs=("S", None))


def causal(x: torch.Tensor) -> torch.Tensor:
    """Causal self-attention over the sequence: each row reads every earlier row."""
    n = x.shape[0]
    scores = (x @ x.T) / H**0.5
    scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ x


def test_causal_attention_on_a_splittable_dim_is_refused_by_a_probe_across_the_split() -> None:
    """Padding keeps causal attention exact, splitting does not: past the largest gear the
    chunks would not see the earlier ones (before: no refusal, and 2.18 off at n = 100 over a
    largest gear of 32). Split probe refuses it; unsplittable, it stays exact."""
    dims = {"SEQLEN": gs.Dim(gears=[8, 32], max=128, splittable=True)}
    transform = Transform(causal, dims, inputs={"x": ("S", None)})
    pool = GraphResourcePool(CpuBackend())
    with pytest.raises(gs.PaddingError, match=r"split into chunks of .*splittable=False"):
        AdaptiveRunner(transform, {"x": torch.zeros(1, H)}, pool=pool)
    dims = {"SEQLEN": gs.Dim(gears=[8, 32], max=128)}
    r = AdaptiveRunner(Transform(causal, dims, inputs={"x": ("S", None)}),
                          {"x": torch.zeros(1, H)}, pool=pool)
    r.capture([{"SEQLEN": 32}, {"SEQLEN": 8}])
    for n in (5, 20, 100):  # 100: eager, unsplit
        x = torch.randn(n, H)
        torch.testing.assert_close(r.run({"x": x}), causal(x))
    rows = AdaptiveRunner(Transform(m, {"SEQLEN": gs.Dim(gears=[8, 32], max=128,
                                                                 splittable=True)},
                                          inputs={"x": ("S", None)}),
                             {"x": torch.zeros(1, H)}, pool=pool)  # row-wise: split freely
    x = torch.randn(100, H)
    torch.testing.assert_close(rows.run({"x": x}), m(x))


def test_a_model_in_train_mode_is_refused_for_train_mode_not_padding() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(H, H), torch.nn.Dropout(0.5))  # not .eval()

    def forward(x: torch.Tensor) -> torch.Tensor:
        return model(x)

    with pytest.raises(gs.PaddingError, match="Sequential is in train mode") as e:
        runner(forward)
    assert "padding changes" not in str(e.value)
    model.eval()
    x = torch.randn(5, H)
    torch.testing.assert_close(captured(runner(forward)).run({"x": x}), forward(x))


def test_tensors_the_function_makes_itself_are_its_own_to_write() -> None:
    def own(x: torch.Tensor) -> torch.Tensor:
        c = torch.tensor([1.0] * H)  # a constant it makes: not state
        c.mul_(2)
        y = torch.arange(float(H))
        y += 1
        out = torch.empty_like(x)
        torch.add(x, c, out=out)
        return out + y + LAYER.weight.t()[0]  # a view of a parameter, read

    x = torch.randn(5, H)
    torch.testing.assert_close(captured(runner(own)).run({"x": x}), own(x))
