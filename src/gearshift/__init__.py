"""gearshift: adaptive shape gears for accelerator graphs, decided by one sidecar per node.

`import gearshift as gs` is the model author's API: `compile` (a function on adaptive gears),
`connect` (a client, for profiles of one's own), `Dim` (a dim's declaration), `group` (a
tensor-parallel rank's group), `outside_capture` (the capture guard) and the errors a worker
catches. The engines' pieces live under their packages: the graph runners, the transform and
the graph pool at `gearshift.graphs`; the client, its profiles, routes, the compiled model and
a group's rank at `gearshift.worker`; the operator's (the policy's configuration, the errors
of the controller and its commands) at `gearshift.controller`. A name that moved from here is
refused with a pointer to its new home (`gearshift.lazy`).
"""

from gearshift.core.dims import Dim
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
from gearshift.lazy import exports, moved_to

# Imported on first use: `import gearshift` stays light, and torch-free (the routing client
# never imports torch; the runner side does).
_LAZY = {
    "compile": "gearshift.worker.compiling",
    "connect": "gearshift.worker.connecting",
    "group": "gearshift.worker.declaring",
    "outside_capture": "gearshift.graphs.device",
}
_MOVED = {
    **moved_to("gearshift", ["AdaptiveRunner", "CompiledRunner", "GraphResourcePool",
                             "Transform"], "gearshift.graphs"),
    "GraphRunner": "gearshift.GraphRunner was removed (only tests used it): a"
                   " gearshift.graphs.AdaptiveRunner of a Transform with one dim does what it did",
    **moved_to("gearshift", ["Client", "Group", "GroupRank", "Maintenance", "Profile", "Route"],
               "gearshift.worker"),
    "Compiled": "gearshift.Compiled was renamed gearshift.worker.CompiledModel",
    "operator": "gearshift.operator moved to gearshift.controller"
                " (`from gearshift.controller import PolicyConfig`)",
}

__all__ = [  # exactly what a model author may import: the names above and `_LAZY`'s
    "BackendUnavailable",
    "ConfigError",
    "ControllerNotFound",
    "Dim",
    "GearshiftError",
    "GroupError",
    "LayoutError",
    "NamespaceBusy",
    "NamespaceError",
    "PaddingError",
    "PayloadError",
    "ProfileMismatch",
    "ShapeError",
    "StateError",
    "compile",
    "connect",
    "group",
    "outside_capture",
]

__getattr__, __dir__ = exports(__name__, _LAZY, _MOVED)
del exports, moved_to
