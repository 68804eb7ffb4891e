"""Gears in engines' start-up forms: every format written, read back as the same gears, and
what an engine cannot take refused."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from gearshift.errors import ConfigError
from gearshift.export import engines

DECODE = {"BATCHSIZE": (1, 2, 8, 24, 40, 64)}
DOC = {
    0: {"decode": DECODE, "prefill": {"SEQLEN": (256, 1024, 4096)}},
    1: {"decode": {"BATCHSIZE": (1, 4, 64)}},
}


@pytest.mark.parametrize("fmt", engines.BATCH_ENGINES)
def test_batch_engines_round_trip_one_profiles_batch_sizes(fmt: str) -> None:
    out = engines.render(DOC, fmt, profile="decode")
    assert engines.detect(out.text) == fmt
    assert engines.parse(out.text) == engines.parse(out.text, fmt) == {0: {"decode": DECODE}}
    assert out.notes == ["devices 1 have other gears for 'decode': this is device 0's "
                         "(--device chooses)"]
    device1 = engines.render(DOC, fmt, profile="decode", device=1)
    assert engines.parse(device1.text) == {1: {"decode": {"BATCHSIZE": (1, 4, 64)}}}


def test_each_engine_gets_its_own_key() -> None:
    # the keys the engines' parsers take (the README says which versions were checked)
    vllm = yaml.safe_load(engines.render(DOC, "vllm", profile="decode").text)
    assert json.loads(vllm["compilation-config"]) == {
        "cudagraph_capture_sizes": [1, 2, 8, 24, 40, 64]
    }
    sglang = yaml.safe_load(engines.render(DOC, "sglang", profile="decode").text)
    assert sglang == {"cuda-graph-bs-decode": [1, 2, 8, 24, 40, 64]}
    trtllm = yaml.safe_load(engines.render(DOC, "trtllm", profile="decode").text)
    assert trtllm == {
        "cuda_graph_config": {"enable_padding": True, "batch_sizes": [1, 2, 8, 24, 40, 64]}
    }
    torchair = engines.render(DOC, "torchair", profile="prefill", axes={"SEQLEN": 1}).text
    assert "\nDIM_GEARS = {1: [256, 1024, 4096]}\n" in torchair
    assert "set_dim_gears(t, dim_gears=DIM_GEARS)" in torchair


def test_json_round_trips_every_device_and_profile_or_the_chosen_ones() -> None:
    assert engines.parse(engines.render(DOC, "json").text) == DOC
    only = engines.render(DOC, "json", profile="decode", device=1).text
    assert engines.parse(only) == {1: {"decode": {"BATCHSIZE": (1, 4, 64)}}}
    with pytest.raises(ConfigError, match="no published gears match"):
        engines.render(DOC, "json", profile="nope")
    with pytest.raises(ConfigError, match="no profile is published"):
        engines.render({0: {}}, "vllm")


def test_torchair_takes_every_dim_as_an_axis_in_product() -> None:
    doc = {0: {"batched": {"BATCHSIZE": (2, 4, 8), "SEQLEN": (128, 512, 2048, 8192)}}}
    out = engines.render(doc, "torchair", axes={"BATCHSIZE": 0, "SEQLEN": 1})
    assert "DIM_GEARS = {0: [2, 4, 8], 1: [128, 512, 2048, 8192]}" in out.text
    assert 'dynamic_gears_merge_policy = "product"' in out.text
    assert engines.parse(out.text) == doc
    one = engines.render(doc, "torchair", dim="SEQLEN", axes={"SEQLEN": 1})
    assert engines.parse(one.text) == {0: {"batched": {"SEQLEN": (128, 512, 2048, 8192)}}}


def test_torchair_keys_gears_by_the_axis_given_and_says_which_it_used() -> None:
    doc = {0: {"prefill": {"SEQLEN": (256, 1024, 4096)}}}  # its tensor is (B, S)
    out = engines.render(doc, "torchair", axes=engines.parse_axes(["SEQLEN=1"]))
    assert "\nDIM_GEARS = {1: [256, 1024, 4096]}\n" in out.text and "(axis 1: SEQLEN)" in out.text
    assert out.notes == ["torchair: prefill/SEQLEN on tensor axis 1 (from --axis)"]
    assert engines.parse(out.text) == engines.parse(out.text, "torchair") == doc
    both = {0: {"b": {"BATCHSIZE": (2, 4), "SEQLEN": (8, 16)}}}  # a (S, B) tensor: by axis
    swapped = engines.render(both, "torchair", axes={"SEQLEN": 0, "BATCHSIZE": 1})
    assert "DIM_GEARS = {0: [8, 16], 1: [2, 4]}" in swapped.text
    assert engines.parse(swapped.text) == both
    old = out.text.replace(', "axes": [1]', "").replace("{1: [", "{0: [")  # before --axis
    assert engines.parse(old) == doc  # its keys were the dims' positions


@pytest.mark.parametrize(
    "axes, message",
    [
        ([], r"axis of prefill/SEQLEN is not known .* --axis SEQLEN=1"),
        (["SEQLEN"], "expected DIM=N"),
        (["SEQLEN=-1"], "expected DIM=N"),
        (["SEQLEN=1", "SEQLEN=2"], "SEQLEN given twice"),
        (["S=1"], r"prefill exports no dim S \(dims: SEQLEN\)"),
    ],
)
def test_torchair_refuses_an_axis_not_given_rather_than_guess(axes: list, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as refused:
        engines.render(DOC, "torchair", profile="prefill", axes=engines.parse_axes(axes))
    assert refused.value.key == "axis"
    with pytest.raises(ConfigError, match="both on axis 0"):
        engines.render({0: {"b": {"B": (2, 4), "S": (8, 16)}}}, "torchair", axes={"B": 0, "S": 0})
    with pytest.raises(ConfigError, match="--axis is torchair's"):
        engines.render(DOC, "vllm", profile="decode", axes={"BATCHSIZE": 0})


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"BATCHSIZE": (1, 2, 4)}, r"gear 1: set_dim_gears takes no gear below 2 \(--fit"),
        ({"BATCHSIZE": (8,)}, "has 1 gears: set_dim_gears takes 2 to 100 a dim"),
        ({"BATCHSIZE": tuple(range(2, 103))}, "has 101 gears"),
        ({"B": tuple(range(2, 13)), "S": tuple(range(2, 12))}, "110 gear combinations"),
    ],
)
def test_torchair_refuses_gears_beyond_its_limits(doc: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        engines.render({0: {"p": doc}}, "torchair")


def test_fit_raises_torchairs_small_gears_and_says_so() -> None:
    out = engines.render({0: {"decode": DECODE}}, "torchair", fit=True, axes={"BATCHSIZE": 0})
    assert engines.parse(out.text) == {0: {"decode": {"BATCHSIZE": (2, 8, 24, 40, 64)}}}
    assert out.notes[0] == "torchair: decode/BATCHSIZE gear 1 raised to 2"
    with pytest.raises(ConfigError, match="has 1 gears"):  # [1, 2] is one gear once raised
        engines.render({0: {"decode": {"BATCHSIZE": (1, 2)}}}, "torchair", fit=True)


def test_batch_engines_say_what_they_leave_out_and_refuse_a_profile_without_the_dim() -> None:
    doc = {0: {"batched": {"BATCHSIZE": (4, 16), "SEQLEN": (512, 4096)}}}
    out = engines.render(doc, "sglang")
    assert out.notes == ["SGLang takes one dim here: batched/SEQLEN left out"]
    assert engines.parse(out.text) == {0: {"batched": {"BATCHSIZE": (4, 16)}}}
    with pytest.raises(ConfigError, match=r"dim: vLLM captures batch sizes only: profile "
                       r"'prefill' has no BATCHSIZE \(dims: SEQLEN\); --dim names"):
        engines.render(DOC, "vllm", profile="prefill")
    tokens = engines.render(DOC, "vllm", profile="prefill", dim="SEQLEN")  # asked for
    assert engines.parse(tokens.text) == {0: {"prefill": {"SEQLEN": (256, 1024, 4096)}}}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, r"profile: 2 profiles are published \(decode, prefill\): choose one"),
        ({"profile": "nope"}, "'nope' is not published"),
        ({"profile": "prefill", "device": 1}, "device 1 has no profile 'prefill'"),
        ({"profile": "decode", "dim": "HEADS"}, "has no HEADS"),
    ],
)
def test_an_engines_file_needs_one_profile_of_one_device(kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        engines.render(DOC, "trtllm", **kwargs)


@pytest.mark.parametrize(
    "text, fmt, gears",
    [
        ("--cuda-graph-bs-decode 1 2 4 --tp 2", "sglang", (1, 2, 4)),
        ("--cuda-graph-bs 1 2 4 --tp 2", "sglang", (1, 2, 4)),  # before per-phase settings
        ("cuda_graph_bs: [3, 5]\n", "sglang", (3, 5)),
        ("--cuda-graph-config '{\"decode\": {\"bs\": [2, 7]}}'", "sglang", (2, 7)),
        ("vllm serve M --compilation-config '{\"cudagraph_capture_sizes\": [1, 4]}'", "vllm",
         (1, 4)),
        ("vllm serve M -cc.cudagraph_capture_sizes=[1,2,3]", "vllm", (1, 2, 3)),
        ("vllm serve M -cc '{\"mode\": 3, \"cudagraph_capture_sizes\": [2, 6]}'", "vllm",
         (2, 6)),
        ("vllm serve M --cudagraph-capture-sizes 4 8 --max-num-seqs 8", "vllm", (4, 8)),
        ("compilation-config:\n  cudagraph_capture_sizes: [16, 8]\n", "vllm", (8, 16)),
        ("cuda_graph_config:\n  batch_sizes: [9, 3]\n", "trtllm", (3, 9)),
    ],
)
def test_an_engines_own_file_or_command_line_reads_as_decode_batch_sizes(
    text: str, fmt: str, gears: tuple[int, ...]
) -> None:
    assert engines.detect(text) == fmt
    assert engines.parse(text) == {0: {"decode": {"BATCHSIZE": gears}}}


@pytest.mark.parametrize(
    "text, fmt, message",
    [
        ("hello: world\n", "auto", "no gears recognised"),
        ("cuda_graph_config:\n  max_batch_size: 64\n", "auto", "no cuda_graph_config.batch"),
        ("--cuda-graph-bs-decode 0 2", "sglang", "gears must be positive ints"),
        ("--cuda-graph-bs-decode two", "sglang", "expected an int size"),
        ("--cuda-graph-config '{\"decode\": {\"max_bs\": 8}}'", "sglang", "decode bs"),
        ("DIM_GEARS = {0: [2, 4]}\n", "auto", "need the '# gearshift:' line"),
        ("DIM_GEARS = {0: [2, 4\n", "torchair", "not torchair gears"),
        ("DIM_GEARS = " + "[" * 100_000, "torchair", "not torchair gears"),
        ('# gearshift: {"format": "vllm", "device": -1, "profile": "d", "dims": ["B"]}\n',
         "auto", "unexpected fields"),
        (engines.render(DOC, "sglang", profile="decode").text, "vllm", "a sglang file read as"),
        ('{"devices": {"0": {"d": {"B": []}}}}', "auto", "at least one gear"),
        ("cuda-graph-bs: [1, 2]\n", "tensorrt", "unknown format 'tensorrt'"),
    ],
)
def test_files_without_usable_gears_are_refused_by_key(text: str, fmt: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        engines.parse(text, fmt)
    assert raised.value.key in ("initial_gears", "format")


_gears = st.lists(st.integers(1, 1 << 20), min_size=1, max_size=12, unique=True)


@settings(max_examples=200, deadline=None)
@given(fmt=st.sampled_from(engines.FORMATS), gears=_gears, device=st.integers(0, 7),
       name=st.sampled_from(["decode", "d-2", "Decode_x"]))
def test_any_gears_an_engine_takes_read_back_the_same(
    fmt: str, gears: list[int], device: int, name: str
) -> None:
    doc = {device: {name: {"BATCHSIZE": tuple(sorted(gears))}}}
    try:
        out = engines.render(doc, fmt, axes={"BATCHSIZE": 0} if fmt == "torchair" else None)
    except ConfigError as e:  # only torchair has limits these gears can break
        assert fmt == "torchair" and e.key == "torchair"
        return
    assert engines.detect(out.text) == fmt
    assert engines.parse(out.text) == doc
