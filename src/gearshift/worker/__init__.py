"""The worker side, torch-free: a session with the node's controller and its profiles.

An engine's pieces, imported on first use (`gearshift.worker.X`): `Client` (what
`gs.connect` returns), `Profile` (its profiles: `run`, `route`, `request`, `record`,
`runner`), `Route` (one request's gears), `CompiledModel` (what `gs.compile` returns), `Group` (a
rank's group declaration, `gs.group`) and `GroupRank` / `Maintenance` (a tensor-parallel
driver's step and its captures and releases).

Modules, each importing only those before it: interfaces (`Host`, what a profile uses of its
client; `Runner`, what it drives), routing (the request path), profile (requests in flight,
adoption, warm-up, release), registration (the mailbox pump), standins (for the ring and the
snapshot region until they exist), session (`Client`), connecting (`connect`).
Graph runners (`gearshift.graphs`, torch) are imported only when a profile builds one.
"""

from gearshift.lazy import exports

_LAZY = {
    "Client": "gearshift.worker.session",
    "CompiledModel": "gearshift.worker.compiling",
    "Group": "gearshift.core.group",
    "GroupRank": "gearshift.worker.group",
    "Maintenance": "gearshift.worker.group",
    "Profile": "gearshift.worker.profile",
    "Route": "gearshift.worker.routing",
}
__all__ = sorted(_LAZY)
_RENAMED = {"Compiled": "gearshift.worker.Compiled was renamed gearshift.worker.CompiledModel"}
__getattr__, __dir__ = exports(__name__, _LAZY, _RENAMED)
del exports
