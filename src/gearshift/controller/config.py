"""Controller configuration: how the daemon runs (the policy's keys are in PolicyConfig).

One TOML file holds both: policy keys at top level or under `[policy]`, controller keys under
`[controller]`. `--set KEY=VALUE` goes to whichever of the two dataclasses has KEY. A key's
value comes from, first to last: its command-line option, `--set`, its `GEARSHIFT_*` variable,
the file, the default; an option and a `--set` of one key that disagree are refused.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from gearshift.configfile import (
    from_environment,
    from_mapping,
    parse_overrides,
    read_toml,
    unknown_key,
)
from gearshift.controller import fleetcodec
from gearshift.core.config import PolicyConfig, check_value
from gearshift.core.fleet import FleetKey
from gearshift.core.round import DeviceLedger
from gearshift.errors import ConfigError, NamespaceError
from gearshift.export.engines import InitialGears, parse
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
    idle_interval_seconds: float = 0.100  # the longest wait while idle (>= the drain's)
    drain_max_events: int = 1 << 16  # per ring per iteration; folded in batches of this size
    scan_interval_seconds: float = 0.5  # slot table: new and dead workers, applied versions
    memory_fresh_seconds: float = 10.0  # older memory readings are ignored
    status_interval_seconds: float = 1.0  # status document (gearshift status, metrics)
    save_interval_seconds: float = 5.0  # state file: a change is saved within this (and at exit)
    fleet_url: str = ""  # "" -> no fleet; an fsspec URL: a directory, s3://bucket/path, ...
    fleet_node: str = ""  # "" -> <host name>.<namespace>
    fleet_model: str = ""  # the fleet key: nodes that declare another never merge
    fleet_engine: str = ""
    fleet_dtype: str = ""
    fleet_device_kind: str = ""
    fleet_tp_size: int = 1
    fleet_publish_seconds: float = 60.0  # publish (and read) at most this often, and at stop
    fleet_ttl_seconds: float = 600.0  # a node's objects expire this long after its last publish
    fleet_timeout_seconds: float = 10.0  # a store slower than this: the node runs alone

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
            "idle_interval_seconds",
            "scan_interval_seconds",
            "memory_fresh_seconds",
            "status_interval_seconds",
            "save_interval_seconds",
        ):
            check_value(key, getattr(self, key), 0.0, 3600.0, low_open=True)
        self._check_fleet()

    def _check_fleet(self) -> None:
        for key in ("fleet_url", "fleet_node", "fleet_model", "fleet_engine", "fleet_dtype",
                    "fleet_device_kind"):
            value = getattr(self, key)
            if not isinstance(value, str) or len(value) > 1024:
                raise ConfigError(key, f"expected text of at most 1024 characters, got "
                                  f"{str(value)[:60]!r}")
        if self.fleet_node and not fleetcodec.NODE.match(self.fleet_node):
            raise ConfigError("fleet_node", f"{self.fleet_node!r} is not 1..128 of "
                              "[A-Za-z0-9_.-]")
        check_value("fleet_tp_size", self.fleet_tp_size, 1, 1 << 16, integer=True)
        for key in ("fleet_publish_seconds", "fleet_ttl_seconds", "fleet_timeout_seconds"):
            check_value(key, getattr(self, key), 0.0, 86400.0, low_open=True)
        if self.fleet_ttl_seconds < 2 * self.fleet_publish_seconds:
            raise ConfigError("fleet_ttl_seconds", f"{self.fleet_ttl_seconds} is under twice "
                              f"fleet_publish_seconds {self.fleet_publish_seconds}: a live "
                              "node would expire between its publishes")

    @property
    def fleet_key(self) -> FleetKey:
        """What this node declares of the nodes it may merge with."""
        return FleetKey(self.fleet_model, self.fleet_engine, self.fleet_dtype,
                        self.fleet_device_kind, self.fleet_tp_size)

    @property
    def fleet_node_name(self) -> str:
        """`fleet_node`, else <host name>.<namespace> (characters outside [A-Za-z0-9_.-] as
        "-", at most 128)."""
        if self.fleet_node:
            return self.fleet_node
        name = re.sub(r"[^A-Za-z0-9_.-]", "-", f"{socket.gethostname()}.{self.namespace}")
        return name[-128:]

    @property
    def state_path(self) -> Path:
        if self.state_dir:
            return Path(self.state_dir)
        base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
        return Path(base) / "gearshift" / self.namespace


def load_configs(
    path: str | Path | None = None, overrides: Iterable[str] = (), **options: Any
) -> tuple[PolicyConfig, ControllerConfig]:
    """Both configs from defaults, then the TOML file, then the `GEARSHIFT_*` variables, then
    `KEY=VALUE` overrides (each to the dataclass that has KEY), then `options` (controller keys
    given as command-line options; None means not given), each over those before it. An option
    and an override of the same key that disagree are refused (ConfigError naming the key)."""
    own = {f.name for f in fields(ControllerConfig)}
    theirs = {f.name for f in fields(PolicyConfig)}
    if path:
        policy = read_toml(path, "policy", cls=PolicyConfig,
                           tables=dict.fromkeys(own, "controller"))
        controller = read_toml(path, "controller", top_level=False, cls=ControllerConfig,
                               tables=dict.fromkeys(theirs, "policy"))
    else:
        policy, controller = {}, {}
    controller.update(from_environment(ControllerConfig))
    mine, others = [], []
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key not in own | theirs:
            raise unknown_key(key or item, own | theirs, " in --set")
        (mine if key in own else others).append(item)
    policy.update(parse_overrides(PolicyConfig, others))
    set_here = parse_overrides(ControllerConfig, mine)
    controller.update(set_here)
    given = {k: v for k, v in options.items() if v is not None}
    for key, value in given.items():
        if key in set_here and set_here[key] != value:
            raise ConfigError(key, f"--{key.replace('_', '-')} {value} and --set {key}="
                              f"{set_here[key]} disagree: give one of them")
    controller.update(given)
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


def seed_lines(path: str, seed: InitialGears, known: Mapping[int, DeviceLedger]) -> list[str]:
    """What `serve` says of `--initial-gears` (`seed`, read from `path`), one line per profile:
    its gears, and whether they seed it or the state file (`known`, its devices) has it."""
    lines = []
    for device, profiles in sorted(seed.items()):
        for name, dims in profiles.items():
            gears = "; ".join(f"{dim} {' '.join(map(str, g))}" for dim, g in dims.items())
            use = ("not used: the state file has this profile's gears"
                   if name in getattr(known.get(device), "profiles", {}) else
                   "its gears until the first decision, once a worker registers it")
            lines.append(f"initial gears from {path}: device {device} profile {name!r}: {gears} "
                         f"({use})")
    return lines
