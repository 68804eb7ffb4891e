"""Graphs, with torch: graph backends, the graph resource pool, transform/recover, runners.

An engine's pieces, imported on first use (`gearshift.graphs.X`): `AdaptiveRunner` (a
function on adaptive gears, one graph per variant), `CompiledRunner` (the same, each variant
its own `torch.compile`), `Transform` (padding a call to its variant and recovering the
outputs) and `GraphResourcePool` (a device's graphs and their limits). Lazy, so that the
torch-free modules here (`streams`) stay torch-free. The controller, the core and the
shared-memory layer never import these modules.
"""

from gearshift.lazy import exports

_LAZY = {
    "AdaptiveRunner": "gearshift.graphs.adaptive",
    "CompiledRunner": "gearshift.graphs.torchcompile",
    "GraphResourcePool": "gearshift.graphs.pool",
    "Transform": "gearshift.graphs.transform",
}
__all__ = sorted(_LAZY)
_REMOVED = ("gearshift.graphs.GraphRunner was removed (only tests used it): an AdaptiveRunner of"
            " a Transform with one dim does what it did")
_RENAMED = {"compiled": "gearshift.graphs.compiled was renamed gearshift.graphs.torchcompile",
            "GraphRunner": _REMOVED, "runner": _REMOVED}
__getattr__, __dir__ = exports(__name__, _LAZY, _RENAMED)
del exports
