"""gearshift: adaptive shape gears for accelerator graphs, decided by one sidecar per node.

`import gearshift as gs` is the worker's API: `connect` (a `Client`), its profiles (`Profile`,
`Dim`; `run`, `route` (a `Route`), `record`), `compile`, a rank's `group` (a `Group`), the
graph runners a worker builds, `outside_capture`, and the errors a worker catches. The
operator's names (the policy's configuration, the errors of the controller and its commands)
are `gearshift.operator`'s.
"""

import importlib

from gearshift.core.dims import Dim
from gearshift.core.group import Group
from gearshift.errors import (
    BackendUnavailable,
    ConfigError,
    ControllerNotFound,
    GearshiftError,
    GroupError,
    LayoutError,
    NamespaceBusy,
    NamespaceError,
    PaddingError,
    PayloadError,
    ProfileMismatch,
    ShapeError,
    StateError,
)

# Imported on first use: `import gearshift` stays light, and torch-free (the routing client
# never imports torch; the runner side does).
_LAZY = {
    "AdaptiveRunner": "gearshift.graphs.adaptive",
    "Client": "gearshift.worker.session",
    "Compiled": "gearshift.worker.compiling",
    "CompiledRunner": "gearshift.graphs.compiled",
    "GraphResourcePool": "gearshift.graphs.pool",
    "GraphRunner": "gearshift.graphs.runner",
    "GroupRank": "gearshift.worker.group",
    "Maintenance": "gearshift.worker.group",
    "Profile": "gearshift.worker.profile",
    "Route": "gearshift.worker.routing",
    "Transform": "gearshift.graphs.transform",
    "compile": "gearshift.worker.compiling",
    "group": "gearshift.worker.declaring",
    "connect": "gearshift.worker.connecting",
    "outside_capture": "gearshift.graphs.device",
}

__all__ = [  # exactly what a worker may import: the names above and `_LAZY`'s
    "AdaptiveRunner",
    "BackendUnavailable",
    "Client",
    "Compiled",
    "CompiledRunner",
    "ConfigError",
    "ControllerNotFound",
    "Dim",
    "GearshiftError",
    "GraphResourcePool",
    "GraphRunner",
    "Group",
    "GroupError",
    "GroupRank",
    "LayoutError",
    "Maintenance",
    "NamespaceBusy",
    "NamespaceError",
    "PaddingError",
    "PayloadError",
    "Profile",
    "ProfileMismatch",
    "Route",
    "ShapeError",
    "StateError",
    "Transform",
    "compile",
    "connect",
    "group",
    "outside_capture",
]


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'gearshift' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
