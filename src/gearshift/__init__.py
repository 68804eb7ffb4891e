"""gearshift: adaptive shape gears for accelerator graphs, decided by one sidecar per node."""

import importlib

from gearshift.config import PolicyConfig, load_policy_config
from gearshift.dims import Dim
from gearshift.errors import (
    BackendUnavailable,
    ConfigError,
    ControllerNotFound,
    ControllerRunning,
    GearshiftError,
    LayoutError,
    NamespaceError,
    PayloadError,
    ProfileMismatch,
    ShapeError,
    StateError,
    TraceError,
)

__all__ = [
    "BackendUnavailable",
    "ConfigError",
    "ControllerNotFound",
    "ControllerRunning",
    "Dim",
    "GearshiftError",
    "LayoutError",
    "NamespaceError",
    "PayloadError",
    "PolicyConfig",
    "ProfileMismatch",
    "ShapeError",
    "StateError",
    "TraceError",
    "load_policy_config",
]

# The torch side, imported on first use: `import gearshift` stays torch-free.
_LAZY = {
    "AdaptiveRunner": "gearshift.client.adaptive",
    "GraphResourcePool": "gearshift.client.pool",
    "GraphRunner": "gearshift.client.runner",
    "Transform": "gearshift.client.transform",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gearshift' has no attribute {name!r}")
