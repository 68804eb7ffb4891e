"""Configuration from files, the environment and the command line: TOML tables, `GEARSHIFT_*`
variables (`gearshift.environment`) and `KEY=VALUE` overrides.

A TOML file holds the policy keys at top level or under a `[policy]` table; `--set
KEY=VALUE` overrides and variables are parsed by the field's type; `none` (or TOML `false`)
disables `device_memory_usage_threshold_ratio`. An unknown key is an error naming the key,
where it was found (the file and table, or `--set`) and the known keys closest to it, or the
table it belongs in.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Collection, Iterable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from gearshift import environment
from gearshift.core.config import PolicyConfig
from gearshift.errors import ConfigError

T = TypeVar("T")


def unknown_key(
    key: str, known: Collection[str], where: str = "", tables: Mapping[str, str] | None = None
) -> ConfigError:
    """The error of `key`, unknown `where` (" in [controller] of gs.toml", " in --set"): the
    table it belongs under if `tables` (key -> table name) has it, else the known keys closest
    to it, else every known key."""
    table = (tables or {}).get(key)
    if table:
        return ConfigError(key, f"a {table} key cannot go{where}: put it under [{table}]")
    close = difflib.get_close_matches(key, sorted(known), n=3)
    hint = f"did you mean {' or '.join(close)}?" if close else f"known: {', '.join(sorted(known))}"
    return ConfigError(key, f"unknown key{where}; {hint}")


def from_mapping(cls: type[T], values: Mapping[str, Any]) -> T:
    """Build a config dataclass from a mapping, naming any unknown key."""
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    for key in values:
        if key not in known:
            raise unknown_key(key, known)
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
            raise unknown_key(key, types, " in --set")
        out[key] = _parse_value(key, str(types[key]), raw.strip())
    return out


def from_environment(cls: type) -> dict[str, Any]:
    """The keys of `cls` whose `GEARSHIFT_*` variable is set, parsed by the field's type; a
    ConfigError names the variable."""
    types = {f.name: str(f.type) for f in fields(cls)}
    out: dict[str, Any] = {}
    for key, raw in environment.given(types).items():
        try:
            out[key] = _parse_value(key, types[key], raw.strip())
        except ConfigError as e:
            message = str(e).removeprefix(f"{key}: ")
            raise ConfigError(key, f"{environment.VARIABLES[key]}: {message}") from None
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


def read_toml(
    path: str | Path, section: str, top_level: bool = True, cls: type | None = None,
    tables: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The keys of `section` in a TOML file (or, if `top_level`, its top level when it has no
    such table). A table other than TABLES (`[polcy]`), a table inside one, or top-level keys
    beside the `[section]` table they would belong to are errors naming them; so is a key that
    is no field of `cls` (if given), with the table `tables` (key -> table) says it belongs
    under, or the closest keys (`unknown_key`)."""
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
    values = {k: v for k, v in table.items() if not isinstance(v, dict)}
    known = {f.name for f in fields(cls)} if cls is not None else set(values)
    where = f" at the top level of {path}" if table is data else f" in [{section}] of {path}"
    for key in values:
        if key not in known:
            raise unknown_key(key, known, where, tables)
    return values


def load_policy_config(path: str | Path | None = None,
                       overrides: Iterable[str] = ()) -> PolicyConfig:
    """PolicyConfig from defaults, then an optional TOML file, then `KEY=VALUE` overrides."""
    values: dict[str, Any] = read_toml(path, "policy", cls=PolicyConfig) if path else {}
    values.update(parse_overrides(PolicyConfig, overrides))
    return from_mapping(PolicyConfig, values)
