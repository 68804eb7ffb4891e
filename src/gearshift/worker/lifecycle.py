"""The two lifecycles of the worker side, as transition tables: {(state, event): next state}.

`advance(table, state, event)` is the only way the code moves one of these states (a
`Machine` holds one under a lock; `Machines`, one per key, such as a profile's variants): an
event the table does not list for the state raises StateError (a bug, never a user's error).

A client (`session.Client.state`), from NO_CONTROLLER:

    state          event           next          when
    no controller  attach          attached      a controller's namespace: slot, ring bound
    no controller  profile         no controller a profile is made (it registers on attach)
    no controller  fork            no controller in a forked child
    no controller  close           closed
    attached       registered      registered    every profile's registration is answered
    attached       profile         attached
    attached       new controller  attached      another controller took over: register again
    attached       fork            no controller in a forked child: the parent's slot is not its
    attached       close           closed
    registered     profile         attached      a new profile registers
    registered     new controller  attached
    registered     fork            no controller
    registered     close           closed

"No controller" also covers a controller whose /dev/shm had no room for the client's ring.

A variant's graph (one gear per dim of a profile; `warmup.WarmUp.state`), from RELEASED:

    state      event     next       when
    released   want      wanted     its gears are in use (a new snapshot, or the first)
    wanted     capture   capturing  the warm-up captures it (largest first, a few a step)
    failed     capture   capturing  a retry: its backoff is over, or the gears in use changed
    capturing  captured  ready      requests replay it from now on
    capturing  failed    failed     in the backoff table; requests run on larger graphs
    ready      release   released   a gear of it left the gears in use, its grace is over
    wanted     release   released   a gear of it left the gears in use before its capture
    failed     release   released   ... after a failed capture: it leaves the backoff table

Capturing lasts one call on the swap thread; no other state of a graph is ever skipped. The
warm-up holds these states (`WarmUp.graphs`, a `Machines`) and moves them by these events;
"wanted" and "released" are its resting states, not stored: a variant it holds no state of
is wanted while the gears in use hold it, else released (the product of the gears is never
enumerated).
"""

from __future__ import annotations

import threading
from collections.abc import Hashable, Mapping

from gearshift.errors import StateError

Table = Mapping[tuple[str, str], str]

NO_CONTROLLER, ATTACHED, REGISTERED, CLOSED = "no controller", "attached", "registered", "closed"
CLIENT: Table = {
    (NO_CONTROLLER, "attach"): ATTACHED,
    (NO_CONTROLLER, "profile"): NO_CONTROLLER,
    (NO_CONTROLLER, "fork"): NO_CONTROLLER,
    (NO_CONTROLLER, "close"): CLOSED,
    (ATTACHED, "registered"): REGISTERED,
    (ATTACHED, "profile"): ATTACHED,
    (ATTACHED, "new controller"): ATTACHED,
    (ATTACHED, "fork"): NO_CONTROLLER,
    (ATTACHED, "close"): CLOSED,
    (REGISTERED, "profile"): ATTACHED,
    (REGISTERED, "new controller"): ATTACHED,
    (REGISTERED, "fork"): NO_CONTROLLER,
    (REGISTERED, "close"): CLOSED,
}

WANTED, CAPTURING, READY, FAILED, RELEASED = "wanted", "capturing", "ready", "failed", "released"
GRAPH: Table = {
    (RELEASED, "want"): WANTED,
    (WANTED, "capture"): CAPTURING,
    (FAILED, "capture"): CAPTURING,
    (CAPTURING, "captured"): READY,
    (CAPTURING, "failed"): FAILED,
    (READY, "release"): RELEASED,
    (WANTED, "release"): RELEASED,
    (FAILED, "release"): RELEASED,
}


def advance(table: Table, state: str, event: str) -> str:
    """The state after `event` in `state`; StateError if `table` has no such transition."""
    try:
        return table[state, event]
    except KeyError:
        raise StateError(f"no transition on {event!r} in state {state!r}") from None


class Machine:
    """One state of `table`, moved by `advance` under `lock` (reentrant: a caller may hold it
    across a check and the advance it leads to)."""

    def __init__(self, table: Table, state: str) -> None:
        self.table, self.state, self.lock = table, state, threading.RLock()

    def advance(self, event: str) -> None:
        with self.lock:
            self.state = advance(self.table, self.state, event)


class Machines:
    """The states in `table` of many keys, each moved by `advance` only (one thread: no lock).
    A key at rest (in `rest`) is not stored, so what rests costs nothing: the caller says
    which resting state a key not stored is in (default `rest[0]`)."""

    def __init__(self, table: Table, rest: tuple[str, ...]) -> None:
        self.table, self.rest = table, rest
        self._states: dict[Hashable, str] = {}

    def state(self, key: Hashable, resting: str | None = None) -> str:
        return self._states.get(key, resting or self.rest[0])

    def advance(self, key: Hashable, event: str, resting: str | None = None) -> str:
        """Move `key` by `event` from its state (`resting`, for a key not stored); StateError,
        moving nothing, if the table has no such transition."""
        new = advance(self.table, self.state(key, resting), event)
        if new in self.rest:
            self._states.pop(key, None)
        else:
            self._states[key] = new
        return new

    def keys(self, state: str) -> list[Hashable]:
        """The stored keys in `state`."""
        return [k for k, s in self._states.items() if s == state]
