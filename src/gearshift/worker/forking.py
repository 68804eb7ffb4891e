"""Clients in a process forked after `connect()` (pre-fork servers, gunicorn-style).

A forked child inherits its parent's mappings: without care it would be a second producer on
the parent's single-producer ring, take replies from the parent's mailboxes, and at exit write
the parent's slot words and stop its embedded controller, removing its state directory. So an
`os.register_at_fork` hook runs every live client's `Client._forked` in the child: the child
keeps its profiles and the snapshot in use but drops every handle of the parent's (slot, ring,
mailboxes, embedded controller), serves unrecorded (counted in `unrecorded`), and its first
record starts its own swap thread, which claims a slot and creates a ring of its own and
registers the profiles again; a child that never records (a data loader's) claims nothing.
Its exit then releases only what it took. The runners' own locks (a compile or capture under
way on the parent's swap thread holds one, and Dynamo's compile lock) are reset by the graph
layer's hook (`graphs.forks`), so the child's runner compiles, captures and closes at once.
"""

from __future__ import annotations

import os

from gearshift.afterfork import Tracked

_clients = Tracked("a gearshift client")  # detached in a child: `Client._forked`
track = _clients.track
os.register_at_fork(after_in_child=_clients.reset)
