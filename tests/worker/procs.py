"""Bodies of worker child processes of the session tests (importable by multiprocessing's
forkserver): a worker that may start before its controller; the profiles they declare."""

from __future__ import annotations

import time

import gearshift as gs

WAIT = 20.0  # seconds: the bound of every wait in a child
PREFILL = {"SEQLEN": gs.Dim(max=4096)}
DECODE = {
    "BATCHSIZE": gs.Dim(gears=[1, 2, 4, 8, 16, 32, 64], splittable=True),
    "SEQLEN": gs.Dim(min=1, max=8192, align=16),
}


def route_on(
    namespace: str, sizes: tuple[int, ...], seconds: float, results, stop, serving: int = 0
) -> None:
    """Connect (the controller may not exist yet) and route SEQLEN `sizes` in turn for
    `seconds` or until `stop`, reporting ("started", slot, version, gears), ("serving",
    unrecorded) once `serving` requests (if not 0) have gone unrecorded, ("version", version,
    gears, slot) at each adoption, then ("done", routes, version, unrecorded); any exception
    ends the process with a nonzero status."""
    with gs.connect(namespace) as client:
        prof = client.profile("prefill", PREFILL)
        results.put(("started", client.slot, prof.version, prof.gears))
        deadline, routes, version = time.monotonic() + min(seconds, WAIT), 0, prof.version
        while not stop.is_set() and time.monotonic() < deadline:
            route = prof.route(SEQLEN=sizes[routes % len(sizes)])
            assert route.gears["SEQLEN"] in prof.gears["SEQLEN"] or route.version != version
            routes += 1
            if 0 < serving <= client.unrecorded:
                results.put(("serving", client.unrecorded))
                serving = 0
            if prof.version != version:
                version = prof.version
                results.put(("version", version, prof.gears, client.slot))
            time.sleep(0.0005)
        results.put(("done", routes, prof.version, client.unrecorded))
