"""A controller run in a daemon thread of a worker process (`connect(embedded=True)`,
`Controller.start_embedded`): the same loop and shared memory as `gearshift serve`.

`stop()` ends the loop gracefully (final drain, state saved); the final save's failure, logged
already by the loop, is kept in `error` rather than lost with the thread.
"""

from __future__ import annotations

import threading
from typing import Generic, Protocol, TypeVar

from gearshift.errors import StateError

__all__ = ["EmbeddedController"]


class Loop(Protocol):
    """What the thread runs: a loop that ends, closed, once `stop` is set."""

    def run(self, stop: threading.Event) -> None: ...


L = TypeVar("L", bound=Loop)


class EmbeddedController(Generic[L]):
    """A controller running in a daemon thread of a worker process (`connect(embedded=True)`)."""

    def __init__(self, controller: L) -> None:
        self.controller = controller
        self._stop = threading.Event()
        self.error: StateError | None = None  # the final save's failure (logged already)
        self._thread = threading.Thread(target=self._run, name="gearshift-controller",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.controller.run(self._stop)
        except StateError as e:
            self.error = e

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop gracefully (final drain, state saved); False if it did not end in `timeout`."""
        self._stop.set()
        self._thread.join(timeout)
        return not self._thread.is_alive()
