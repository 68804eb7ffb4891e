"""Gears in the forms that engines take at start-up: `export --format`, `serve --initial-gears`.

A gears document (`InitialGears`: device -> profile -> dim -> gears) is written as, and read
back from, one of `FORMATS`:

- `json`: `{"devices": {"<device>": {"<profile>": {"<dim>": [gears]}}}}`, gearshift's own;
- `vllm`: YAML for `vllm serve --config`: `compilation-config` holding
  `{"cudagraph_capture_sizes": [...]}`, vLLM's CUDA graph capture sizes (vllm-ascend's ACL graph
  sizes are the same key);
- `sglang`: YAML for `--config`: `cuda-graph-bs-decode: [...]`, SGLang's decode CUDA graph
  batch sizes (`cuda-graph-bs` in releases before its per-phase CUDA graph settings);
- `trtllm`: YAML for `trtllm-serve --extra_llm_api_options` (`--config` in newer releases):
  `cuda_graph_config: {enable_padding: true, batch_sizes: [...]}`;
- `torchair`: Python: `DIM_GEARS = {axis: [...]}`, the `dim_gears` of
  `torchair.inference.set_dim_gears(tensor, dim_gears=DIM_GEARS)`, keyed by the tensor axis
  of each dim: given (`axes`, `export --axis DIM=N`), never taken from the dim's position
  in the profile (a SEQLEN profile's tensor is often (B, S)); the controller is not told the
  runners' bindings, so an axis not given is refused.

An engine's file holds one profile of one device. vLLM, SGLang and TensorRT-LLM capture batch
sizes only: one dim (`BATCHSIZE` unless told), the others are left out and said so. torchair
takes every dim (or `dim`) at its tensor axis, within its limits (2 to 100 gears a dim, no
gear below 2, at most 100 combinations); gears beyond an engine's limits are refused, or with
`fit` raised to its smallest gear. Each file starts with `# gearshift: {...}` (format,
device, profile, dims; torchair: their axes) so that it reads back as the same gears (a
torchair header without axes is an older file's: its axes are the dims' positions); a
file written by hand (or an
engine's command line: `--cuda-graph-bs-decode 1 2 4`, `--compilation-config '{...}'`) reads as
device 0, profile `decode`, dim `BATCHSIZE`.

Pure: text in, text out; every failure is a `ConfigError` naming the option or key at fault.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from gearshift.core.dims import Gears, normalize_gears
from gearshift.errors import ConfigError, ShapeError
from gearshift.export import engine_text

InitialGears = dict[int, dict[str, dict[str, Gears]]]  # device -> profile -> dim -> gears

FORMATS = ("json", "vllm", "sglang", "trtllm", "torchair")
BATCH_ENGINES = ("vllm", "sglang", "trtllm")  # they capture one dim: the batch size
DEFAULT_PROFILE, DEFAULT_DIM = "decode", "BATCHSIZE"  # of a file without the header
TORCHAIR_MIN_GEAR = 2  # its symbolic dims start at 2: a gear of 0 or 1 never hits the graph
TORCHAIR_MAX_GEARS = 100  # gears of one dim, and combinations of all dims
HEADER = "# gearshift: "
_HEADER = re.compile(r"^#\s*gearshift:\s*(\{.*\})\s*$", re.MULTILINE)
_VLLM_KEYS = ("compilation-config", "cudagraph-capture-sizes", "cuda-graph-sizes")
_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM", "torchair": "torchair"}


class Export(NamedTuple):
    """What `render` wrote: the text, and notes on what the engine cannot express (for
    stderr)."""

    text: str
    notes: list[str]


def render(
    doc: Mapping[int, Mapping[str, Mapping[str, Sequence[int]]]],
    fmt: str,
    *,
    profile: str | None = None,
    dim: str | None = None,
    device: int | None = None,
    fit: bool = False,
    axes: Mapping[str, int] | None = None,
) -> Export:
    """`doc` written in format `fmt` (see the module docstring); `profile`, `dim` and
    `device` choose what an engine's file holds (json: they filter, default everything);
    `axes` gives torchair the tensor axis of each dim exported (required there, refused
    elsewhere)."""
    if fmt not in FORMATS:
        raise ConfigError("format", f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    try:
        doc = _checked(doc)
    except ShapeError as e:
        raise ConfigError("gears", str(e)) from None
    if fmt == "json":
        return Export(_json(_filtered(doc, profile, dim, device)) + "\n", [])
    notes: list[str] = []
    device, profile, dims = _choose(doc, fmt, profile, dim, device, notes)
    dims = _within_limits(fmt, profile, dims, fit, notes)
    fields: dict[str, Any] = {"format": fmt, "device": device, "profile": profile,
                              "dims": list(dims)}
    if fmt == "torchair":
        fields["axes"] = _axes(profile, dims, axes or {}, notes)
        dims = {name: dims[name] for name in sorted(dims, key=fields["axes"].__getitem__)}
        fields["dims"], fields["axes"] = list(dims), [fields["axes"][d] for d in dims]
    elif axes:
        raise ConfigError("axis", f"--axis is torchair's (tensor axes); {_NAMES[fmt]} takes "
                          "batch sizes")
    header = HEADER + json.dumps(fields)
    body = _BODIES[fmt](f"{profile}/{next(iter(dims))}", device, profile, dims,
                        *([fields["axes"]] if fmt == "torchair" else []))
    return Export("\n".join([header, *body]) + "\n", notes)


def parse(text: str, fmt: str = "auto") -> InitialGears:
    """The gears document in `text` of format `fmt` ("auto": detected); ConfigError when it
    holds none."""
    header = _header(text)
    if fmt == "auto":
        fmt = detect(text, header)
    if fmt not in FORMATS:
        raise ConfigError("format", f"unknown format {fmt!r} (known: {', '.join(FORMATS)})")
    if header and header["format"] not in (fmt, None):
        raise ConfigError("initial_gears", f"a {header['format']} file read as {fmt}")
    try:
        if fmt == "json":
            return _checked(json.loads(text)["devices"])
        device = header["device"] if header else 0
        profile = header["profile"] if header else DEFAULT_PROFILE
        if fmt == "torchair":
            gears = engine_text.torchair_axes(text)
            names = header["dims"] if header else None
            at = (header.get("axes") or list(range(len(names)))) if names else []
            if names is None or sorted(gears) != sorted(at) or len(at) != len(names):
                raise ConfigError(
                    "initial_gears",
                    f"torchair's gears are per tensor axis ({sorted(gears)}): the dims they "
                    f"are need the '{HEADER.strip()}' line of gearshift export",
                )
            dims = {name: gears[axis] for name, axis in zip(names, at, strict=True)}
        else:
            names = header["dims"] if header else [DEFAULT_DIM]
            if len(names) != 1:
                raise ConfigError("initial_gears", f"{_NAMES[fmt]} takes one dim, not {names}")
            dims = {names[0]: _BATCH_PARSERS[fmt](text)}
        return {device: {profile: {d: normalize_gears(g) for d, g in dims.items()}}}
    except (ShapeError, TypeError, ValueError, KeyError, AttributeError, SyntaxError,
            RecursionError) as e:  # what json, yaml and ast.literal_eval raise on bad text
        if isinstance(e, ConfigError):
            raise
        raise ConfigError("initial_gears", f"not {fmt} gears: {e}") from None


def detect(text: str, header: dict[str, Any] | None = None) -> str:
    """The format of `text`: the header's, else recognised by its keys or flags."""
    header = header if header is not None else _header(text)
    if header and header["format"]:
        return str(header["format"])
    if text.lstrip().startswith("{"):
        return "json"
    if engine_text.DIM_GEARS.search(text):
        return "torchair"
    data = engine_text.yaml_of(text)
    words = [w.lstrip("-").split("=", 1)[0].split(".")[0]
             for w in engine_text.command_words(text) if w[:1] == "-"]
    keys = {str(k).replace("_", "-") for k in [*(data if isinstance(data, dict) else ()), *words]}
    if "cuda-graph-config" in keys:  # SGLang's is per phase, TensorRT-LLM's has batch_sizes
        phases = engine_text.mapping(engine_text.option(text, ("cuda-graph-config",), many=False))
        return "sglang" if {"decode", "prefill"} & set(phases) else "trtllm"
    if keys & {*_VLLM_KEYS, "cc"}:
        return "vllm"
    if keys & set(engine_text.SGLANG_KEYS):
        return "sglang"
    raise ConfigError(
        "initial_gears",
        f"no gears recognised (formats: {', '.join(FORMATS)}; a file of gearshift export "
        "names its format on its first line)",
    )


def _checked(doc: Mapping[Any, Mapping[str, Mapping[str, Sequence[int]]]]) -> InitialGears:
    """`doc` with int devices and normalized gears; ShapeError on bad gears."""
    return {
        int(d): {str(p): {str(n): normalize_gears(g) for n, g in dims.items()}
                 for p, dims in profiles.items()}
        for d, profiles in doc.items()
    }


def _filtered(doc: InitialGears, profile: str | None, dim: str | None,
              device: int | None) -> InitialGears:
    out = {
        d: {p: {n: g for n, g in dims.items() if dim in (None, n)}
            for p, dims in profiles.items() if profile in (None, p)}
        for d, profiles in doc.items() if device in (None, d)
    }
    out = {d: {p: dims for p, dims in ps.items() if dims} for d, ps in out.items()}
    out = {d: ps for d, ps in out.items() if ps}
    if not out:
        raise ConfigError("profile", "no published gears match --profile, --dim, --device")
    return out


def _json(doc: InitialGears) -> str:
    return json.dumps(
        {"devices": {str(d): {p: {n: list(g) for n, g in dims.items()}
                              for p, dims in profiles.items()}
                     for d, profiles in sorted(doc.items())}},
        indent=1,
    )


def _choose(doc: InitialGears, fmt: str, profile: str | None, dim: str | None,
            device: int | None, notes: list[str]) -> tuple[int, str, dict[str, Gears]]:
    """(device, profile, dims) that an engine's file holds."""
    published = sorted({p for profiles in doc.values() for p in profiles})
    if not published:
        raise ConfigError("profile", "no profile is published")
    if profile is None:
        if len(published) != 1:
            raise ConfigError("profile", f"{len(published)} profiles are published "
                              f"({', '.join(published)}): choose one with --profile")
        [profile] = published
    holders = sorted(d for d, profiles in doc.items() if profile in profiles)
    if not holders:
        raise ConfigError("profile", f"{profile!r} is not published "
                          f"(published: {', '.join(published)})")
    if device is None:
        device = holders[0]
    elif device not in holders:
        raise ConfigError("device", f"device {device} has no profile {profile!r} "
                          f"(devices with it: {', '.join(map(str, holders))})")
    dims = doc[device][profile]
    others = [d for d in holders if doc[d][profile] != dims]
    if others:
        notes.append(f"devices {', '.join(map(str, others))} have other gears for {profile!r}: "
                     f"this is device {device}'s (--device chooses)")
    if fmt == "torchair" and dim is None:
        return device, profile, dict(dims)
    name = dim or DEFAULT_DIM
    if name not in dims:
        what = "captures batch sizes only" if fmt in BATCH_ENGINES else "takes named dims"
        raise ConfigError("dim", f"{_NAMES[fmt]} {what}: profile {profile!r} has no {name} "
                          f"(dims: {', '.join(dims)}); --dim names the one to export")
    left = [d for d in dims if d != name]
    if left:
        notes.append(f"{_NAMES[fmt]} takes one dim here: {profile}/{', '.join(left)} left out")
    return device, profile, {name: dims[name]}


def _within_limits(fmt: str, profile: str, dims: dict[str, Gears], fit: bool,
                   notes: list[str]) -> dict[str, Gears]:
    """`dims` as the engine takes them (torchair's limits), or ConfigError."""
    if fmt != "torchair":
        return dims
    out = {}
    for name, gears in dims.items():
        low = [g for g in gears if g < TORCHAIR_MIN_GEAR]
        if low and not fit:
            raise ConfigError("torchair", f"{profile}/{name} has gear {low[0]}: set_dim_gears "
                              f"takes no gear below {TORCHAIR_MIN_GEAR} (--fit raises it to "
                              f"{TORCHAIR_MIN_GEAR}: such requests run padded to it)")
        if low:
            gears = normalize_gears([max(g, TORCHAIR_MIN_GEAR) for g in gears])
            notes.append(f"torchair: {profile}/{name} gear {low[0]} raised to {gears[0]}")
        if not 2 <= len(gears) <= TORCHAIR_MAX_GEARS:
            raise ConfigError("torchair", f"{profile}/{name} has {len(gears)} gears: "
                              f"set_dim_gears takes 2 to {TORCHAIR_MAX_GEARS} a dim")
        out[name] = gears
    combinations = math.prod(len(g) for g in out.values())
    if combinations > TORCHAIR_MAX_GEARS:
        raise ConfigError("torchair", f"{profile} has {combinations} gear combinations: "
                          f"torchair takes at most {TORCHAIR_MAX_GEARS}")
    return out


def parse_axes(items: Sequence[str]) -> dict[str, int]:
    """`DIM=N` items (`export --axis`) as {dim: axis}; ConfigError naming a bad or repeated
    one."""
    out: dict[str, int] = {}
    for item in items:
        name, eq, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name or not value.isdigit():
            raise ConfigError("axis", f"expected DIM=N (N: the tensor axis, an int >= 0), "
                              f"got {item!r}")
        if name in out:
            raise ConfigError("axis", f"{name} given twice")
        out[name] = int(value)
    return out


def _axes(profile: str, dims: dict[str, Gears], axes: Mapping[str, int],
          notes: list[str]) -> dict[str, int]:
    """The tensor axis of each of `dims` from `axes` (a note says which was used), or
    ConfigError: one missing, one of another dim, or two dims on one axis."""
    unknown = sorted(set(axes) - set(dims))
    if unknown:
        raise ConfigError("axis", f"{profile} exports no dim {unknown[0]} (dims: "
                          f"{', '.join(dims)})")
    missing = [d for d in dims if d not in axes]
    if missing:
        raise ConfigError("axis", f"torchair keys gears by tensor axis, and the axis of "
                          f"{profile}/{missing[0]} is not known (the controller is not told "
                          f"the runners' bindings): give it, e.g. --axis {missing[0]}=1 for "
                          f"a dim at position 1 of the tensor set_dim_gears is called on")
    taken: dict[int, str] = {}
    for name in dims:
        axis = axes[name]
        if type(axis) is not int or axis < 0:
            raise ConfigError("axis", f"{name}={axis!r}: an axis is an int >= 0")
        if axis in taken:
            raise ConfigError("axis", f"{taken[axis]} and {name} both on axis {axis}")
        taken[axis] = name
    notes.append("torchair: " + ", ".join(f"{profile}/{d} on tensor axis {axes[d]}"
                                          for d in dims) + " (from --axis)")
    return {d: axes[d] for d in dims}


def _items(gears: Gears) -> str:
    return ", ".join(map(str, gears))


def _vllm(what: str, device: int, profile: str, dims: dict[str, Gears]) -> list[str]:
    [gears] = dims.values()
    value = json.dumps({"cudagraph_capture_sizes": list(gears)})
    return [
        f"# vLLM's CUDA graph capture sizes (vllm-ascend: ACL graph sizes): the gears of {what}",
        f"# on device {device}: vllm serve MODEL --config THIS.yaml, or on the command line",
        f"#   --compilation-config '{value}'",
        "# vLLM drops sizes above --max-num-batched-tokens (decode graphs: above --max-num-seqs)",
        f"compilation-config: '{value}'",
    ]


def _sglang(what: str, device: int, profile: str, dims: dict[str, Gears]) -> list[str]:
    [gears] = dims.values()
    return [
        f"# SGLang's decode CUDA graph batch sizes: the gears of {what} on device {device}:",
        "# python -m sglang.launch_server --model-path MODEL --config THIS.yaml, or on the",
        f"# command line: --cuda-graph-bs-decode {' '.join(map(str, gears))}",
        "# (releases before SGLang's per-phase CUDA graph settings: --cuda-graph-bs)",
        f"cuda-graph-bs-decode: [{_items(gears)}]",
    ]


def _trtllm(what: str, device: int, profile: str, dims: dict[str, Gears]) -> list[str]:
    [gears] = dims.values()
    return [
        f"# TensorRT-LLM's CUDA graph batch sizes, padded up: the gears of {what} on device "
        f"{device}:",
        "# trtllm-serve MODEL --extra_llm_api_options THIS.yaml (--config in newer releases)",
        "cuda_graph_config:",
        "  enable_padding: true",
        f"  batch_sizes: [{_items(gears)}]",
    ]


def _torchair(what: str, device: int, profile: str, dims: dict[str, Gears],
              at: list[int]) -> list[str]:
    axes = ", ".join(f"axis {i}: {name}" for i, name in zip(at, dims, strict=True))
    lines = [
        f"# torchair's dim gears: the gears of {profile} ({axes}) on device {device}, for GE",
        "# graph mode under torch.compile(dynamic=True), set on the first call's input t:",
        "#   torchair.inference.set_dim_gears(t, dim_gears=DIM_GEARS)",
        "# torchair does not pad: run each request padded to its gear (profile.route gives it)",
    ]
    if len(dims) > 1:
        lines.append('# two dims or more: config.inference_config.dynamic_gears_merge_policy = '
                     '"product"')
    items = ", ".join(f"{i}: [{_items(g)}]" for i, g in zip(at, dims.values(), strict=True))
    return [*lines, f"DIM_GEARS = {{{items}}}"]


_BODIES = {"vllm": _vllm, "sglang": _sglang, "trtllm": _trtllm, "torchair": _torchair}


def _header(text: str) -> dict[str, Any] | None:
    """The `# gearshift: {...}` line's fields (format may be None), or None without one."""
    found = _HEADER.search(text)
    if found is None:
        return None
    try:
        data = json.loads(found[1])
        header = {"format": data.get("format"), "device": data["device"],
                  "profile": data["profile"], "dims": data["dims"], "axes": data.get("axes")}
    except (ValueError, KeyError, AttributeError) as e:
        raise ConfigError("initial_gears", f"unreadable gearshift line: {e}") from None
    device, profile, dims = header["device"], header["profile"], header["dims"]
    if (type(device) is not int or device < 0 or not isinstance(profile, str) or not profile
            or not isinstance(dims, list) or not dims
            or not all(isinstance(d, str) and d for d in dims) or len(set(dims)) != len(dims)
            or header["format"] not in (None, *FORMATS)
            or not _axes_ok(header["axes"], dims)):
        raise ConfigError("initial_gears", f"gearshift line of unexpected fields: {found[1]}")
    return header


def _axes_ok(axes: Any, dims: list[Any]) -> bool:
    """A header's `axes`: absent, or one distinct int >= 0 per dim."""
    return axes is None or (isinstance(axes, list) and len(axes) == len(dims)
                            and all(type(a) is int and a >= 0 for a in axes)
                            and len(set(axes)) == len(axes))


_BATCH_PARSERS = {"vllm": engine_text.vllm_sizes, "sglang": engine_text.sglang_sizes,
                  "trtllm": engine_text.trtllm_sizes}
