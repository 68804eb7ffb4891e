"""The static buffers a runner's graphs read (`graphs.buffers.StaticBuffers`): sized by the
largest gears so far in every dim, viewed at a variant's gears, grown once for a larger one."""

from __future__ import annotations

import pytest
import torch

import gearshift as gs
from gearshift.errors import ShapeError
from gearshift.graphs import Transform
from gearshift.graphs.buffers import StaticBuffers

H = 3
DIMS = {"BATCHSIZE": gs.Dim(gears=[1, 2, 4], max=8), "SEQLEN": gs.Dim(gears=[4, 8, 16], max=16)}


def buffers(caps: tuple[int, int]) -> StaticBuffers:
    transform = Transform(lambda x, mask, scale: x, DIMS,
                             inputs={"x": ("B", "S", None), "mask": ("B",), "scale": (None,)})
    example = {"x": torch.zeros(1, 1, H), "mask": torch.zeros(1, dtype=torch.bool),
               "scale": torch.ones(H)}
    return StaticBuffers(transform, example, caps, torch.device("cpu"))


def test_views_are_the_leading_rows_of_buffers_at_the_caps() -> None:
    b = buffers((2, 8))
    assert b.buffers["x"].shape == (2, 8, H) and b.buffers["mask"].shape == (2,)
    assert "scale" not in b.buffers  # an unbound input has no buffer
    v = b.views((1, 4))
    assert v["x"].shape == (1, 4, H) and v["mask"].shape == (1,)
    assert v["x"].data_ptr() == b.buffers["x"].data_ptr()
    assert v["mask"].dtype == torch.bool


def test_a_larger_view_in_one_dim_keeps_the_caps_of_the_others() -> None:
    b = buffers((2, 16))
    b.views((4, 4))  # larger batch, shorter sequence: one allocation at (4, 16)
    assert b.caps == (4, 16) and b.buffers["x"].shape == (4, 16, H)
    grown = b.buffers["x"]
    for gears in [(4, 16), (1, 16), (4, 8), (2, 4)]:  # all within the caps: no allocation
        b.views(gears)
        assert b.buffers["x"] is grown
    assert b.footprint()["SEQLEN"] == (16, 4 * 16 * H * 4 + 4, 4 * 16 * H * 4)


def test_a_resize_for_a_restaging_may_shrink() -> None:
    b = buffers((4, 16))
    b.resize((1, 4))
    assert b.caps == (1, 4) and b.buffers["x"].shape == (1, 4, H)


def test_a_call_of_another_dtype_or_static_size_is_refused_naming_the_input() -> None:
    b = buffers((2, 8))
    ok = {"x": torch.zeros(2, 8, H), "mask": torch.zeros(2, dtype=torch.bool),
          "scale": torch.ones(H)}
    b.check(ok)
    with pytest.raises(ShapeError, match=r"x is torch\.float64"):
        b.check({**ok, "x": ok["x"].double()})
    with pytest.raises(ShapeError, match="x axis 2 is 5; the graphs were built for 3"):
        b.check({**ok, "x": torch.zeros(2, 8, 5)})
    with pytest.raises(ShapeError, match="scale axis 0 is 4"):
        b.check({**ok, "scale": torch.ones(4)})
