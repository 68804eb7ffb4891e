"""gearshift: adaptive shape gears for accelerator graphs, decided by one sidecar per node."""

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
