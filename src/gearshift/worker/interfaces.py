"""The two interfaces of a profile: `Host`, what it uses of the session that made it (a
`Client`), and `Runner`, what it drives (an `AdaptiveRunner`).

A profile knows its client only through `Host`, so the profile modules never import the
session module; the session builds profiles and satisfies `Host` structurally.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from gearshift.core.dims import Gears, Route


class Runner(Protocol):
    """What a profile drives (an `AdaptiveRunner`): gears to run on, warm-up, release, run
    (`run(tensors, sizes, route)` replays the route the profile found, with no lookup of its own).

    `capture` captures the given variants that are not ready and returns how many (a failure
    raises, leaving nothing behind); `release` drops every variant of one gear and gives its
    memory back to the device; `room` says how many more graphs the device may hold (None: no
    cap) and why it is capped. A runner that measures its graphs also has
    `take_measurements() -> [(variant as dim -> gear, cost)]` (`graphs.measure.GraphCost`),
    which the profile reports to the controller, and may have `buffer_bytes() -> {dim: (gear,
    bytes, bytes on the dim)}` (its static input buffers, `StaticBuffers.footprint`), which it
    reports too. A runner that remembers what its requests
    found not ready also has `take_wanted() -> [variant as in ready()]`; a profile defers
    start-up gears (`worker.warmup`) only for such a runner."""

    gears: dict[str, Gears]
    transform: Any  # .check(tensors) -> raw size per dim

    def ready(self) -> list[tuple[int, ...]]: ...

    def capture(self, variants: Iterable[Mapping[str, int]]) -> int: ...

    def release(self, dim: str, gear: int) -> int: ...

    def room(self) -> tuple[int | None, str]: ...

    def run(self, tensors: Mapping[str, Any], sizes: Mapping[str, int] | None = None,
            route: Route | None = None) -> Any: ...


class Stoppable(Protocol):
    """An embedded controller, as the client that started it stops it."""

    def stop(self) -> None: ...


class Versioned(Protocol):
    """The snapshot region as the request path sees it: its version, one 8-byte read."""

    def version(self) -> int: ...


class RecordWriter(Protocol):
    """The event ring as the request path sees it: one packed record per request."""

    def write(self, t_ns: int, v0: int, v1: int, v2: int, v3: int, meta: int, counts: int) -> bool:
        ...


class NsClock(Protocol):
    """The clock that stamps a request's record."""

    def now_ns(self) -> int: ...


class Host(Protocol):
    """What a profile uses of its client: the snapshot version to compare with the one last
    adopted (`_seen`), adoption (`_refresh`), the ring and clock of its records, and the swap
    thread (`_wake`, `_attached`). The underscored members are the client's internals, not
    its API."""

    @property
    def region(self) -> Versioned: ...

    @property
    def _seen(self) -> int: ...

    @property
    def ring(self) -> RecordWriter: ...

    @property
    def clock(self) -> NsClock: ...

    def _refresh(self, force: bool = False) -> None:
        """Adopt the region's snapshot into every profile if its version changed; request
        threads only try."""

    def _wake(self) -> None:
        """Run the swap thread's next tick now (replaced gears drained: graphs may be freed)."""

    def _attached(self, runner: Runner) -> None:
        """A profile attached `runner`."""
