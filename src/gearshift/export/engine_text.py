"""Reading an engine's own settings: YAML keys, command-line flags, lists of sizes.

`engines.parse` reads gears through these; each raises ValueError, KeyError or SyntaxError on
text that does not hold what it looks for (the caller turns them into one ConfigError).
"""

from __future__ import annotations

import ast
import json
import re
import shlex
from collections.abc import Sequence
from typing import Any

import yaml

DIM_GEARS = re.compile(r"^\s*DIM_GEARS\s*=\s*(.+?)\s*$", re.MULTILINE)  # torchair's, one line
SGLANG_KEYS = ("cuda-graph-bs-decode", "cuda-graph-bs")


def yaml_of(text: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return None


def command_words(text: str) -> list[str]:
    """The command-line words of `text` (comments and quotes as a shell reads them)."""
    try:
        return shlex.split(text, comments=True)
    except ValueError:
        return []


def option(text: str, names: Sequence[str], many: bool) -> Any:
    """The value of the first of `names` in `text`: a YAML key (`-` or `_`), else a
    command-line flag (`--name V`, `--name=V`; `many`: every word up to the next flag)."""
    data = yaml_of(text)
    if isinstance(data, dict):
        table = {str(k).replace("_", "-"): v for k, v in data.items()}
        for name in names:
            if name.lstrip("-") in table:
                return table[name.lstrip("-")]
    words = command_words(text)
    for i, word in enumerate(words):
        flag, eq, value = word.partition("=")
        if flag.lstrip("-").replace("_", "-") in [n.lstrip("-") for n in names]:
            if eq:
                return value
            rest = words[i + 1:]
            count = next((j for j, w in enumerate(rest) if w.startswith("-")), len(rest))
            return rest[:count] if many else rest[0] if rest else None
    return None


def mapping(value: Any) -> dict[str, Any]:
    """A YAML mapping, or a JSON object text (a command line's), as a dict; else {}."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def ints(value: Any) -> list[int]:
    """A list of ints from a YAML list, a JSON list text, or command-line words."""
    if isinstance(value, str):
        value = json.loads(value) if value.lstrip().startswith("[") else value.split(",")
    if not isinstance(value, list):
        raise ValueError(f"expected a list of sizes, got {value!r}")
    out = []
    for v in value:
        if isinstance(v, str) and v.strip().lstrip("-").isdigit():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"expected an int size, got {v!r}")
        out.append(v)
    return out


def vllm_sizes(text: str) -> list[int]:
    sizes = option(text, ("cudagraph-capture-sizes", "cuda-graph-sizes"), many=True)
    if sizes is None:
        dotted = option(text, ("compilation-config.cudagraph-capture-sizes",
                                "cc.cudagraph-capture-sizes"), many=False)
        config = option(text, ("compilation-config", "cc"), many=False)
        if dotted is not None:
            sizes = dotted
        elif config is not None:
            sizes = mapping(config)["cudagraph_capture_sizes"]
        else:
            raise KeyError("no cudagraph_capture_sizes")
    return ints(sizes)


def sglang_sizes(text: str) -> list[int]:
    sizes = option(text, SGLANG_KEYS, many=True)
    if sizes is None:
        phases = mapping(option(text, ("cuda-graph-config",), many=False))
        if not isinstance(phases.get("decode"), dict) or "bs" not in phases["decode"]:
            raise KeyError("no cuda-graph-bs-decode, cuda-graph-bs or cuda-graph-config decode bs")
        sizes = phases["decode"]["bs"]
    return ints(sizes)


def trtllm_sizes(text: str) -> list[int]:
    config = yaml_of(text)
    section = config.get("cuda_graph_config") if isinstance(config, dict) else None
    if not isinstance(section, dict) or not section.get("batch_sizes"):
        raise KeyError("no cuda_graph_config.batch_sizes (the engine would derive them)")
    return ints(section["batch_sizes"])


def torchair_axes(text: str) -> dict[int, list[int]]:
    found = DIM_GEARS.search(text)
    value = ast.literal_eval(found[1] if found else text.strip())
    if not isinstance(value, dict) or not all(type(k) is int for k in value):
        raise ValueError(f"expected {{axis: [gears]}}, got {value!r}")
    return {k: ints(list(v)) for k, v in value.items()}
