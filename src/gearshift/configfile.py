"""Configuration from files and the command line: TOML tables and `KEY=VALUE` overrides.

A TOML file holds the policy keys at top level or under a `[policy]` table; `--set
KEY=VALUE` overrides are parsed by the field's type; `none` (or TOML `false`) disables
`device_memory_usage_threshold_ratio`. Unknown keys are errors naming the key.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from gearshift.core.config import PolicyConfig
from gearshift.errors import ConfigError

T = TypeVar("T")


def from_mapping(cls: type[T], values: Mapping[str, Any]) -> T:
    """Build a config dataclass from a mapping, naming any unknown key."""
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    for key in values:
        if key not in known:
            raise ConfigError(key, f"unknown key (known: {', '.join(sorted(known))})")
    optional = {f.name for f in fields(cls) if "None" in str(f.type)}  # type: ignore[arg-type]
    clean = {k: (None if v is False and k in optional else v) for k, v in values.items()}
    return cls(**clean)


def parse_overrides(cls: type, overrides: Iterable[str]) -> dict[str, Any]:
    """Parse `KEY=VALUE` strings by the type of the field named KEY."""
    types = {f.name: f.type for f in fields(cls)}
    out: dict[str, Any] = {}
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep:
            raise ConfigError(key or item, "expected KEY=VALUE")
        if key not in types:
            raise ConfigError(key, f"unknown key (known: {', '.join(sorted(types))})")
        out[key] = _parse_value(key, str(types[key]), raw.strip())
    return out


_EXPECTED = {"int": "an integer", "float": "a number", "bool": "true or false"}


def _parse_value(key: str, type_name: str, raw: str) -> Any:
    """`raw` as the field's type (`type_name`, its annotation); a ConfigError naming `key` says
    what is expected (`none` too when the field is optional)."""
    optional = "None" in type_name
    if optional and raw.lower() in ("none", "null", "off", ""):
        return None
    try:
        if type_name.startswith("int"):
            return int(raw)
        if type_name.startswith("float"):
            return float(raw)
        if type_name.startswith("bool"):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1")
    except ValueError:
        expected = next(e for t, e in _EXPECTED.items() if type_name.startswith(t))
        raise ConfigError(
            key, f"expected {expected}{' or none' if optional else ''}, got {raw!r}"
        ) from None
    return raw


TABLES = ("policy", "controller")  # the tables a configuration file may hold


def read_toml(path: str | Path, section: str, top_level: bool = True) -> dict[str, Any]:
    """The keys of `section` in a TOML file (or, if `top_level`, its top level when it has no
    such table). A table other than TABLES (`[polcy]`), a table inside one, or top-level keys
    beside the `[section]` table they would belong to are errors naming them."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError("config", f"file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError("config", f"{path} is not valid TOML: {e}") from None
    for key, value in data.items():
        if isinstance(value, dict) and key not in TABLES:
            raise ConfigError(key, f"unknown table [{key}] in {path} (known: "
                              f"{', '.join(f'[{t}]' for t in TABLES)})")
    loose = [k for k, v in data.items() if not isinstance(v, dict)]
    if top_level and section in data and loose:
        raise ConfigError(loose[0], f"a top-level key beside the [{section}] table in {path}: "
                          f"move it into the table")
    table = data.get(section, data if top_level else {})
    if not isinstance(table, dict):
        raise ConfigError(section, f"expected a table in {path}")
    inner = [k for k, v in table.items() if isinstance(v, dict) and table is not data]
    if inner:
        raise ConfigError(inner[0], f"unknown table [{section}.{inner[0]}] in {path}")
    return {k: v for k, v in table.items() if not isinstance(v, dict)}


def load_policy_config(path: str | Path | None = None,
                       overrides: Iterable[str] = ()) -> PolicyConfig:
    """PolicyConfig from defaults, then an optional TOML file, then `KEY=VALUE` overrides."""
    values: dict[str, Any] = read_toml(path, "policy") if path else {}
    values.update(parse_overrides(PolicyConfig, overrides))
    return from_mapping(PolicyConfig, values)
