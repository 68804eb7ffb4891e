"""Transform/recover: padded, chunked execution equals eager execution; bindings are checked."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gearshift as gs
from gearshift.graphs import AdaptiveRunner
from gearshift.graphs.transform import Span, Transform

H = 8
torch.manual_seed(0)
LAYER = torch.nn.Linear(H, H)


@torch.no_grad()
def rowwise(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(LAYER(x)) * 2 + 1


@torch.no_grad()
def masked(x: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    y = torch.tanh(LAYER(x)) * mask.unsqueeze(-1)
    return {"y": y, "pooled": y.sum(1)}


def dims2(s_splittable: bool) -> dict[str, gs.Dim]:
    return {
        "BATCHSIZE": gs.Dim(gears=[1, 2, 4], max=12, splittable=True),
        "SEQLEN": gs.Dim(gears=[4, 8, 16], max=40, splittable=s_splittable, pad_value=0.0),
    }


def inputs(b: int, s: int) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(b, s, H), "mask": (torch.rand(b, s) > 0.3).float()}


ONE = Transform(
    rowwise,
    {"BATCHSIZE": gs.Dim(gears=[1, 2, 4, 8], max=40, splittable=True)},
    inputs={"x": ("B", None)},
)
TWO = Transform(  # the mask, padded with 0, makes the padding harmless to the pooled sum
    masked, dims2(False), inputs={"x": ("B", "S", None), "mask": ("B", "S")},
    handles_padding=("S",),
)
TWO_SPLIT = Transform(
    lambda x, mask: masked(x, mask)["y"],
    dims2(True),
    inputs={"x": ("B", "S", None), "mask": ("B", "S")},
)


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 40))
def test_one_dim_equals_eager(b: int) -> None:
    x = torch.randn(b, H)
    torch.testing.assert_close(ONE({"x": x}), rowwise(x))
    assert ONE.outputs == [("BATCHSIZE", None)]  # found by symbolic tracing


def test_one_dim_tiling_splits_over_the_largest_gear() -> None:
    tiling = ONE.tile({"BATCHSIZE": 19})
    assert tiling is not None
    assert tiling.spans["BATCHSIZE"] == (Span(0, 8, 8), Span(8, 8, 8), Span(16, 3, 4))
    assert ONE.tile({"BATCHSIZE": 3}).spans["BATCHSIZE"] == (Span(0, 3, 4),)  # type: ignore[union-attr]


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 12), s=st.integers(1, 40))
def test_two_dims_equals_eager_with_eager_overflow(b: int, s: int) -> None:
    t = inputs(b, s)
    got, want = TWO(t), masked(**t)
    torch.testing.assert_close(got, want)
    assert (TWO.tile({"BATCHSIZE": b, "SEQLEN": s}) is None) == (s > 16)  # SEQLEN not splittable
    assert TWO.outputs == [("BATCHSIZE", "SEQLEN", None), ("BATCHSIZE", None)]  # y, pooled


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 12), s=st.integers(1, 40))
def test_two_dims_both_split_equals_eager(b: int, s: int) -> None:
    t = inputs(b, s)
    torch.testing.assert_close(TWO_SPLIT(t), masked(**t)["y"])


def test_gears_can_be_given_per_call() -> None:
    t = inputs(5, 9)
    tiling = TWO.tile({"BATCHSIZE": 5, "SEQLEN": 9}, {"BATCHSIZE": (3, 6), "SEQLEN": (10,)})
    assert tiling is not None and [c["BATCHSIZE"].gear for c in tiling.chunks()] == [6]
    torch.testing.assert_close(TWO(t, {"BATCHSIZE": (3, 6), "SEQLEN": (10,)}), masked(**t))


def test_transform_pads_each_axis_with_its_pad_value() -> None:
    dims = {"BATCHSIZE": gs.Dim(gears=[4], max=4), "SEQLEN": gs.Dim(gears=[3], max=3, pad_value=-1)}
    t = Transform(lambda x: x, dims, inputs={"x": ("S", "B")})
    x = torch.ones(2, 3)  # S=2, B=3
    chunk = t.tile(t.check({"x": x})).chunks()[0]  # type: ignore[union-attr]
    padded = t.transform({"x": x}, chunk)["x"]
    # S (axis 0) pads a whole row with -1, then B (axis 1) a whole column with 0: the last wins
    assert padded.tolist() == [[1, 1, 1, 0], [1, 1, 1, 0], [-1, -1, -1, 0]]


def test_declared_outputs_skip_tracing() -> None:
    def data_dependent(x: torch.Tensor) -> torch.Tensor:
        return x * 2 if bool(x.abs().sum() >= 0) else x

    dims = {"BATCHSIZE": gs.Dim(gears=[2, 4], max=9, splittable=True)}
    with pytest.raises(gs.ShapeError, match="declare outputs"):
        Transform(data_dependent, dims, inputs={"x": ("B", None)})({"x": torch.ones(3, 2)})
    t = Transform(data_dependent, dims, inputs={"x": ("B", None)}, outputs=("B", None))
    x = torch.randn(9, 2)
    torch.testing.assert_close(t({"x": x}), x * 2)


def test_output_axis_that_is_not_one_symbol_must_be_declared() -> None:
    t = Transform(lambda x: x.reshape(-1), {"BATCHSIZE": gs.Dim(max=8)}, inputs={"x": ("B", None)})
    with pytest.raises(gs.ShapeError, match="not one dim's: declare outputs"):
        t({"x": torch.ones(3, 2)})


def test_cut_views_or_copies_the_chunk_rows() -> None:
    t = Transform(
        lambda x: (x, x[0, 0]),
        dims2(False),
        inputs={"x": ("B", "S", None)},
        outputs=[("B", "S", None), (None,)],
    )
    leaves = [torch.randn(4, 8, H), torch.randn(H)]
    chunk = {"BATCHSIZE": Span(0, 3, 4), "SEQLEN": Span(0, 5, 8)}
    views, copies = t.cut(leaves, chunk), t.cut(leaves, chunk, copy=True)
    torch.testing.assert_close(views, [leaves[0][:3, :5], leaves[1]])
    torch.testing.assert_close(copies, views)
    for leaf, view, copy in zip(leaves, views, copies, strict=True):
        assert view.untyped_storage().data_ptr() == leaf.untyped_storage().data_ptr()
        assert copy.untyped_storage().data_ptr() != leaf.untyped_storage().data_ptr()


def test_join_needs_the_split_axis_in_every_output() -> None:
    t = Transform(masked, dims2(True), inputs={"x": ("B", "S", None), "mask": ("B", "S")},
                  handles_padding=("S",))
    with pytest.raises(gs.ShapeError, match="output 1 has no SEQLEN axis"):
        t(inputs(2, 20))  # SEQLEN splits, but "pooled" summed it away


@pytest.mark.parametrize(
    ("tensors", "match"),
    [
        ({"x": torch.ones(0, 3, H), "mask": torch.ones(0, 3)}, r"x axis 0: BATCHSIZE=0 is outside"),
        (
            {"x": torch.ones(13, 3, H), "mask": torch.ones(13, 3)},
            r"BATCHSIZE=13 is outside \[1, 12\]",
        ),
        (
            {"x": torch.ones(2, 3, H), "mask": torch.ones(4, 3)},
            r"mask axis 0 \(BATCHSIZE\) is 4, but x",
        ),
        ({"x": torch.ones(2, 3, H), "mask": torch.ones(2, 5)}, r"mask axis 1 \(SEQLEN\) is 5"),
        ({"x": torch.ones(2, 3), "mask": torch.ones(2, 3)}, r"x: expected 3 axes"),
        ({"x": torch.ones(2, 3, H)}, r"expected inputs \['mask', 'x'\]"),
    ],
)
def test_bad_tensors_are_clear_errors(tensors: dict[str, torch.Tensor], match: str) -> None:
    with pytest.raises(gs.ShapeError, match=match):
        TWO.check(tensors)


@pytest.mark.parametrize(
    ("sizes", "match"),
    [
        ({"BATCHSIZE": -1, "SEQLEN": 3}, r"BATCHSIZE=-1 is outside"),
        ({"BATCHSIZE": 0, "SEQLEN": 3}, r"BATCHSIZE=0 is outside"),
        ({"BATCHSIZE": 2, "SEQLEN": 41}, r"SEQLEN=41 is outside \[1, 40\]"),
        ({"BATCHSIZE": 2, "SEQLEN": 3, "HEADS": 1}, r"unknown dim\(s\) \['HEADS'\]"),
        ({"BATCHSIZE": 2}, r"missing a size for dim SEQLEN"),
    ],
)
def test_bad_sizes_are_clear_errors(sizes: dict[str, int], match: str) -> None:
    with pytest.raises(gs.ShapeError, match=match):
        TWO.tile(sizes)


def test_bad_bindings_are_clear_errors() -> None:
    dims = dims2(False)
    with pytest.raises(gs.ShapeError, match="unknown symbol 'T'"):
        Transform(masked, dims, inputs={"x": ("B", "T", None)})
    with pytest.raises(gs.ShapeError, match="unknown dim 'HEADS'"):
        Transform(masked, dims, inputs={"x": ("B", "S")}, symbols={"B": "HEADS"})
    with pytest.raises(gs.ShapeError, match=r"no input axis carries dim\(s\) \['SEQLEN'\]"):
        Transform(masked, dims, inputs={"x": ("B", None, None)})
    custom = Transform(
        masked,
        dims,
        inputs={"x": ("b", "s", None), "mask": ("b", "s")},
        symbols={"b": "BATCHSIZE", "s": "SEQLEN"},
    )
    assert custom.inputs["mask"] == ("BATCHSIZE", "SEQLEN")


def test_inputs_are_checked_against_the_signature() -> None:
    dims = {"BATCHSIZE": gs.Dim(max=8)}
    with pytest.raises(gs.ShapeError, match=r"input 'inp' is not a parameter of .*\(x\)"):
        Transform(lambda x: x, dims, inputs={"inp": ("B", None)})
    with pytest.raises(gs.ShapeError, match=r"requires \['mask'\], which no input gives"):
        Transform(masked, dims, inputs={"x": ("B", None)})
    with pytest.raises(gs.ShapeError, match="input 'n' is not a parameter"):
        Transform(lambda x: x, dims, inputs={"x": ("B", None)}, lengths={"n": "B"})
    Transform(lambda **kw: kw["inp"], dims, inputs={"inp": ("B", None)})  # takes any name
    Transform(LAYER, dims, inputs={"input": ("B", None)})  # a module: its forward's names


def test_an_input_that_is_not_a_tensor_is_named() -> None:
    with pytest.raises(gs.ShapeError, match=r"x must be a torch\.Tensor, got list"):
        ONE.check({"x": [[1.0] * H]})  # type: ignore[dict-item]



def test_a_meta_tensor_is_a_clear_gearshift_error() -> None:
    """Before: torch's raw device error from the trace or the probe."""
    t = Transform(lambda x: x * 2, {"SEQLEN": gs.Dim(max=64)}, inputs={"x": ("S", None)})
    with pytest.raises(gs.ShapeError, match="x is on the meta device"):
        AdaptiveRunner(t, {"x": torch.zeros(3, 4, device="meta")})


def test_check_gives_the_sizes_in_dim_order_and_refuses_inputs_that_want_grad() -> None:
    """`check`'s one pass: sizes keyed in the profile's dim order whatever order the inputs
    bind them in; an input that requires grad refused while grad is on, accepted off."""
    def swapped(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x * mask.t().unsqueeze(-1)

    t = Transform(swapped, dims2(False), inputs={"mask": ("S", "B"), "x": ("B", "S", None)})
    x, mask = torch.ones(2, 3, H), torch.ones(3, 2)
    assert list(t.check({"mask": mask, "x": x}).items()) == [("BATCHSIZE", 2), ("SEQLEN", 3)]
    wanting = {"mask": mask, "x": x.requires_grad_()}
    with pytest.raises(gs.ShapeError, match=r"x require\(s\) grad"):
        t.check(wanting)
    with torch.no_grad():
        assert t.check(wanting) == {"BATCHSIZE": 2, "SEQLEN": 3}
