"""Runners in a child forked while one of the parent's threads held their locks.

A pre-fork server may fork while the swap thread compiles or captures (holding a runner's
capture lock, and Dynamo's process-wide compile lock) or while a request thread replays
(holding its replay lock). The child has none of those threads, so every lock they held stays
held there for good: its runner would never capture again and its `close()` would wait for
a compile nobody runs. An `os.register_at_fork` hook gives every live runner fresh locks in
the child (`track`; the runner's `_forked`), Dynamo a fresh compile lock and Inductor a fresh
compile thread pool (torch's own hook renews its process pool only: a C++ compile in the child
would wait for the parent's pool threads for ever), as `worker.forking` does for the client's.
What the parent's thread was doing is simply not done in the child: a half-made variant
was never added (variants are added whole, under the replay lock, once captured), so the
child captures it again when its warm-up wants it.
"""

from __future__ import annotations

import os
import sys
import threading

from gearshift.afterfork import Tracked

_runners = Tracked("a gearshift runner")  # fresh locks in a child: the runner's `_forked`
track = _runners.track


def _in_child() -> None:
    convert = sys.modules.get("torch._dynamo.convert_frame")
    if convert is not None and hasattr(convert, "compile_lock"):
        convert.compile_lock = threading.RLock()  # held by the parent's compiling thread?
    compiling = sys.modules.get("torch._inductor.async_compile")
    pool = getattr(getattr(compiling, "AsyncCompile", None), "pool", None)
    if hasattr(pool, "cache_clear"):  # the parent's thread pool, whose threads the child
        pool.cache_clear()  # lacks: its C++ compiles would wait for them for ever
    _runners.reset()


os.register_at_fork(after_in_child=_in_child)
