"""Dims and gears: ladder, routing, chunking, padded work, validation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gearshift.core.dims import (
    Dim,
    check_profile,
    chunks_for,
    gear_for,
    ladder,
    normalize_gears,
    padded_cost,
    padded_work,
)
from gearshift.errors import ShapeError


@pytest.mark.parametrize(("low", "high", "gears"), [
    (1, 64, (1, 2, 4, 8, 16, 32, 64)),
    (3, 100, (4, 8, 16, 32, 64, 100)),
    (16, 16, (16,)),
    (5, 7, (7,)),
])
def test_ladder(low, high, gears):
    assert ladder(low, high) == gears


@pytest.mark.parametrize(("raw", "gear"), [(1, 8), (8, 8), (9, 32), (32, 32), (33, None)])
def test_gear_for(raw, gear):
    assert gear_for((8, 32), raw) == gear


@pytest.mark.parametrize(("raw", "splittable", "chunks"), [
    (130, True, (64, 64, 2)),  # BATCHSIZE=130 on 1..64: two full chunks and the remainder
    (128, True, (64, 64)),
    (64, True, (64,)),
    (63, True, (64,)),
    (130, False, ()),  # not splittable: eager
    (3, False, (4,)),
])
def test_chunks_for(raw, splittable, chunks):
    assert chunks_for(ladder(1, 64), raw, splittable) == chunks


@given(st.lists(st.integers(1, 500), min_size=1, max_size=10),
       st.lists(st.integers(1, 3000), min_size=1, max_size=50), st.booleans())
def test_padded_work_is_the_sum_of_the_chunks(gears, raws, splittable):
    g = normalize_gears(gears)
    expected = [sum(chunks_for(g, r, splittable)) or r for r in raws]
    assert padded_work(g, np.array(raws), splittable).tolist() == expected


def test_dim_defaults_and_initial_gears():
    assert Dim(max=100).initial_gears == ladder(1, 100)
    assert Dim(gears=[64, 16, 16, 32]).initial_gears == (16, 32, 64)


@pytest.mark.parametrize(("value", "align", "low", "high", "out"), [
    (41, 8, 1, 256, 48),
    (48, 8, 1, 256, 48),
    (250, 16, 1, 250, 250),  # clamped to max
    (1, 16, 4, 256, 16),
    (2, 1, 4, 256, 4),  # clamped to min
])
def test_aligned(value, align, low, high, out):
    assert Dim(min=low, max=high, align=align).aligned(value) == out


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"min": 0}, "Dim.min must be a positive int"),
    ({"max": 2.5}, "Dim.max must be a positive int"),
    ({"align": True}, "Dim.align must be a positive int"),
    ({"min": 10, "max": 5}, "exceeds Dim.max"),
    ({"gears": [8, 300], "max": 256}, "outside"),
    ({"gears": [0, 8]}, "positive ints"),
    ({"gears": []}, "at least one gear"),
])
def test_dim_validation(kwargs, message):
    with pytest.raises(ShapeError, match=message):
        Dim(**kwargs)


@pytest.mark.parametrize(("raw", "ok"), [(1, True), (256, True), (0, False), (257, False),
                                         (np.int64(5), True), (2.0, False), (True, False)])
def test_check(raw, ok):
    dim = Dim(max=256)
    if ok:
        dim.check("B", raw)
    else:
        with pytest.raises(ShapeError, match="B="):
            dim.check("B", raw)


def test_cost_is_a_polynomial_of_the_chunk_size() -> None:
    assert Dim().work(np.array([0, 3, 10])).tolist() == [0.0, 3.0, 10.0]
    attention = Dim(cost=[1, 2, 0.5])
    assert attention.cost == (1.0, 2.0, 0.5)
    assert attention.work(np.array([2, 4])).tolist() == [7.0, 17.0]


@pytest.mark.parametrize("cost", [(), (1.0,), (0.0, 0.0), (0.0, -1.0), (0.0, float("inf")),
                                  ("a", 1.0), 5])
def test_bad_costs_are_shape_errors(cost: object) -> None:
    with pytest.raises(ShapeError, match=r"Dim\.cost"):
        Dim(cost=cost)  # type: ignore[arg-type]


@given(
    raws=st.lists(st.integers(1, 500), min_size=1, max_size=30),
    gears=st.sets(st.integers(1, 100), min_size=1, max_size=6),
    splittable=st.booleans(),
)
def test_padded_cost_sums_each_chunks_cost(raws: list[int], gears: set[int], splittable: bool):
    g = tuple(sorted(gears))
    flat = Dim(gears=g, max=500, splittable=splittable)
    assert padded_cost(flat, g, np.array(raws)).tolist() == padded_work(
        g, np.array(raws), splittable).tolist()
    steep = Dim(gears=g, max=500, splittable=splittable, cost=(1.0, 0.0, 1.0))
    expected = [sum(1 + c * c for c in chunks_for(g, r, splittable)) or 1 + r * r for r in raws]
    assert padded_cost(steep, g, np.array(raws)).tolist() == expected


@pytest.mark.parametrize(("fields", "named"), [
    ({"splittable": "false"}, "Dim.splittable"),
    ({"splittable": 1}, "Dim.splittable"),
    ({"pad_value": float("nan")}, "Dim.pad_value"),
    ({"pad_value": "x"}, "Dim.pad_value"),
    ({"gears": 5}, "Dim.gears"),
    ({"gears": "12"}, "Dim.gears"),
    ({"max": 2**63}, "Dim.max"),
    ({"max": 2**64 - 1}, "Dim.max"),
    ({"cost": "12"}, "Dim.cost"),
    ({"cost": (0.0,) * 8 + (1e300,)}, "Dim.cost"),  # infinite at max
    ({"min": "x" * 10_000}, "Dim.min"),
])
def test_a_bad_field_is_a_short_shape_error_naming_it(fields: dict, named: str) -> None:
    with pytest.raises(ShapeError, match=named) as info:
        Dim(**fields)
    assert len(str(info.value)) < 300


def test_numbers_of_other_types_are_kept_as_python_numbers() -> None:
    dim = Dim(pad_value=np.float32(0.5), gears=np.array([4, 2]), cost=[0, np.float64(2)])
    assert (type(dim.pad_value), dim.gears, dim.cost) == (float, (2, 4), (0.0, 2.0))
    assert type(Dim(pad_value=np.int64(3)).pad_value) is int


@pytest.mark.parametrize(("name", "dims", "error"), [
    ("", {"B": Dim()}, "profile name"),
    (7, {"B": Dim()}, "profile name"),
    ("p", {}, "1 to 4 dims"),
    ("p", {f"D{i}": Dim() for i in range(5)}, "1 to 4 dims"),
    ("p", {"": Dim()}, "must name a gs.Dim"),
    ("p", {3: Dim()}, "must name a gs.Dim"),
    ("p", {"B": 5}, "must name a gs.Dim"),
    ("p" * 300, {"B": Dim()}, "profile name"),
])
def test_check_profile_is_the_one_rule_of_a_profile(name: object, dims: dict, error: str) -> None:
    with pytest.raises(ShapeError, match=error):
        check_profile(name, dims)  # type: ignore[arg-type]
    assert check_profile("p", {"B": Dim()}) == {"B": Dim()}
