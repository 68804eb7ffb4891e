"""Graphs, with torch: graph backends, the graph resource pool, transform/recover, runners.

An engine's pieces, imported on first use (`gearshift.graphs.X`): `AdaptiveRunner` (a
function on adaptive gears, one graph per variant), `CompiledRunner` (the same, each variant
its own `torch.compile`), `Transform` (padding a call to its variant and recovering the
outputs), `GraphResourcePool` (a device's graphs and their limits) and `GraphRunner` (one
batch dim, one graph per gear). Lazy, so that the torch-free modules here (`streams`) stay
torch-free. The controller, the core and the shared-memory layer never import these modules.
"""

from gearshift.lazy import exports

_LAZY = {
    "AdaptiveRunner": "gearshift.graphs.adaptive",
    "CompiledRunner": "gearshift.graphs.torchcompile",
    "GraphResourcePool": "gearshift.graphs.pool",
    "GraphRunner": "gearshift.graphs.runner",
    "Transform": "gearshift.graphs.transform",
}
__all__ = sorted(_LAZY)
_RENAMED = {"compiled": "gearshift.graphs.compiled was renamed gearshift.graphs.torchcompile"}
__getattr__, __dir__ = exports(__name__, _LAZY, _RENAMED)
del exports
