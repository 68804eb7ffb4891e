"""The controller (`gearshift serve`), and the operator's names: the policy's configuration
and the errors the controller and its commands (`serve`, `simulate`, `trace`, `cleanup`)
raise. `from gearshift.controller import PolicyConfig, load_policy_config`.

A model author's names are `gearshift`'s (`import gearshift as gs`); `ConfigError` is both
audiences'. (This was `gearshift.operator`, a name that shadowed the standard library's
`operator` in a caller's namespace; the old name is refused with a pointer.)
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
