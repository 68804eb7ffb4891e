"""Controller configuration: how the daemon runs (the policy's keys are in PolicyConfig).

One TOML file holds both: policy keys at top level or under `[policy]`, controller keys under
`[controller]`. `--set KEY=VALUE` goes to whichever of the two dataclasses has KEY.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from gearshift.configfile import from_mapping, parse_overrides, read_toml
from gearshift.controller.engines import InitialGears, parse
from gearshift.core.config import PolicyConfig, check_value
from gearshift.errors import ConfigError, NamespaceError
from gearshift.shm import names


@dataclass(frozen=True)
class ControllerConfig:
    """The daemon's settings; the decision cadence is PolicyConfig.check_interval_seconds."""

    namespace: str = "default"
    state_dir: str = ""  # "" -> $XDG_STATE_HOME/gearshift/<namespace>
    metrics_port: int | None = None
    metrics_addr: str = "127.0.0.1"  # the metrics endpoint's address: this host only
    slots: int = 64  # worker slots, when this controller creates the namespace
    drain_interval_seconds: float = 0.010  # one loop iteration: mailboxes, rings
    drain_max_events: int = 1 << 16  # per ring per iteration; folded in batches of this size
    scan_interval_seconds: float = 0.5  # slot table: new and dead workers, applied versions
    memory_fresh_seconds: float = 10.0  # older memory readings are ignored
    status_interval_seconds: float = 1.0  # status document (gearshift status, metrics)

    def __post_init__(self) -> None:
        try:
            names.validate(self.namespace)
        except NamespaceError as e:
            raise ConfigError("namespace", str(e)) from None
        if not isinstance(self.state_dir, str):
            raise ConfigError("state_dir", f"expected a path, got {self.state_dir!r}")
        if self.metrics_port is not None:
            check_value("metrics_port", self.metrics_port, 0, 65535, integer=True)
        if not isinstance(self.metrics_addr, str) or not self.metrics_addr.strip():
            raise ConfigError(
                "metrics_addr", f"expected a host name or IP address, got {self.metrics_addr!r}"
            )
        check_value("slots", self.slots, 1, 4096, integer=True)
        check_value("drain_max_events", self.drain_max_events, 1, 1 << 24, integer=True)
        for key in (
            "drain_interval_seconds",
            "scan_interval_seconds",
            "memory_fresh_seconds",
            "status_interval_seconds",
        ):
            check_value(key, getattr(self, key), 0.0, 3600.0, low_open=True)

    @property
    def state_path(self) -> Path:
        if self.state_dir:
            return Path(self.state_dir)
        base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
        return Path(base) / "gearshift" / self.namespace


def load_configs(
    path: str | Path | None = None, overrides: Iterable[str] = (), **options: Any
) -> tuple[PolicyConfig, ControllerConfig]:
    """Both configs from defaults, then the TOML file, then `KEY=VALUE` overrides (each to the
    dataclass that has KEY), then `options` (controller keys given as command-line options;
    None means not given)."""
    policy = read_toml(path, "policy") if path else {}
    controller = read_toml(path, "controller", top_level=False) if path else {}
    own = {f.name for f in fields(ControllerConfig)}
    known = own | {f.name for f in fields(PolicyConfig)}
    mine, theirs = [], []
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key not in known:
            raise ConfigError(key or item, f"unknown key (known: {', '.join(sorted(known))})")
        (mine if key in own else theirs).append(item)
    policy.update(parse_overrides(PolicyConfig, theirs))
    controller.update(parse_overrides(ControllerConfig, mine))
    controller.update({k: v for k, v in options.items() if v is not None})
    return from_mapping(PolicyConfig, policy), from_mapping(ControllerConfig, controller)


def load_initial_gears(path: str | Path, fmt: str = "auto") -> InitialGears:
    """The gears that `gearshift export` writes, in any of its formats (`engines.FORMATS`;
    "auto": detected), to seed profiles new to the state file."""
    try:
        return parse(Path(path).read_text(), fmt)
    except OSError as e:
        raise ConfigError("initial_gears", f"{path}: {e.strerror or e}") from None
    except ConfigError as e:
        message = str(e).removeprefix("initial_gears: ")
        raise ConfigError("initial_gears", f"{path}: {message}") from None
