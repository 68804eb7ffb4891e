"""The operator's names: the policy's configuration and the errors the controller and its
commands (`gearshift serve`, `simulate`, `trace`, `cleanup`) raise.

A worker's names are `gearshift`'s (`import gearshift as gs`); `ConfigError` is both audiences'.
"""

from gearshift.configfile import load_policy_config
from gearshift.core.config import PolicyConfig
from gearshift.errors import (
    ConfigError,
    ControllerRunning,
    NamespaceLost,
    SpaceError,
    StateError,
    TraceError,
    UnsafeStateDir,
)

__all__ = [
    "ConfigError",
    "ControllerRunning",
    "NamespaceLost",
    "PolicyConfig",
    "SpaceError",
    "StateError",
    "TraceError",
    "UnsafeStateDir",
    "load_policy_config",
]
