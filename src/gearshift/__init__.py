"""gearshift: adaptive shape gears for accelerator graphs, decided by one sidecar per node."""

import importlib

from gearshift.configfile import load_policy_config
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim
from gearshift.errors import (
    BackendUnavailable,
    ConfigError,
    ControllerNotFound,
    ControllerRunning,
    GearshiftError,
    LayoutError,
    NamespaceError,
    PaddingError,
    PayloadError,
    ProfileMismatch,
    ShapeError,
    StateError,
    TraceError,
)

__all__ = [
    "BackendUnavailable",
    "Client",
    "Compiled",
    "ConfigError",
    "ControllerNotFound",
    "ControllerRunning",
    "Dim",
    "GearshiftError",
    "LayoutError",
    "NamespaceError",
    "PaddingError",
    "PayloadError",
    "Plan",
    "PolicyConfig",
    "Profile",
    "ProfileMismatch",
    "Route",
    "ShapeError",
    "StateError",
    "TraceError",
    "compile",
    "connect",
    "load_policy_config",
]

# Imported on first use: `import gearshift` stays light, and torch-free (the routing client
# never imports torch; the runner side does).
_LAZY = {
    "AdaptiveRunner": "gearshift.graphs.adaptive",
    "Client": "gearshift.worker.session",
    "Compiled": "gearshift.worker.compiling",
    "CompiledRunner": "gearshift.graphs.compiled",
    "GraphResourcePool": "gearshift.graphs.pool",
    "GraphRunner": "gearshift.graphs.runner",
    "Profile": "gearshift.worker.profile",
    "Route": "gearshift.worker.routing",
    "Transform": "gearshift.graphs.transform",
    "compile": "gearshift.worker.compiling",
    "connect": "gearshift.worker.connecting",
    "outside_capture": "gearshift.graphs.device",
}
_ALIASES = {"Plan": "Route"}  # Route's old name, kept for existing callers


def __getattr__(name: str) -> object:
    target = _ALIASES.get(name, name)
    if target in _LAZY:
        return getattr(importlib.import_module(_LAZY[target]), target)
    raise AttributeError(f"module 'gearshift' has no attribute {name!r}")
