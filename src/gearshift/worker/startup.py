"""Lazy capture of start-up gears: which variants a profile's warm-up leaves until a request
wants them.

A start-up gear is one of its Dim's initial gears (a guess, such as the powers of two up to
max) while every snapshot adopted since the start has kept it; once one drops it, it is an
ordinary gear for good (a later re-add is captured at adoption, as any added gear). A plan
defers a variant that holds, on some dim, a start-up gear other than that dim's largest gear
in use (`deferred`): the largest variant is always captured at once, so every request has a
graph from the start, padded to it at worst. A deferred variant is captured once a request
wanted it: the runner remembers the variants its chunks found not ready (`take_wanted`), and
`StartupGears.collect` keeps them, at most MAX_HELD, for the warm-up to capture.

`StartupGears.gears` is replaced whole on adoption and only shrinks, so a warm-up that reads
it while a newer snapshot is adopted at worst captures a variant early. With `lazy` off there
are no start-up gears: nothing is deferred, every variant is captured at adoption; nor is
anything deferred for a runner that does not say what requests wanted.
"""

from __future__ import annotations

from collections.abc import Mapping

from gearshift.core.dims import Dim, Gears, Variant

MAX_HELD = 4096  # wanted variants held for a capture (once full, no more kept)
Deferred = tuple[frozenset[int], ...]  # per dim (in dim order), the gears a plan defers


class StartupGears:
    """A profile's start-up gears per dim and the wanted variants waiting for a capture."""

    def __init__(self, dims: Mapping[str, Dim], lazy: bool) -> None:
        self.lazy = lazy
        self.gears = {d: frozenset(s.initial_gears if lazy else ()) for d, s in dims.items()}
        self.wanted: dict[Variant, None] = {}  # in the order requests wanted them

    def adopted(self, gears: Mapping[str, Gears]) -> None:
        """A snapshot of these gears in use was adopted: the start-up gears it lacks leave."""
        self.gears = {d: held.intersection(gears[d]) for d, held in self.gears.items()}

    def deferred(self, gears: Mapping[str, Gears], runner: object) -> Deferred:
        """Per dim of `gears` (the gears in use), the start-up gears but its largest; none
        when `runner` cannot tell what requests wanted (no `take_wanted`)."""
        start = self.gears if hasattr(runner, "take_wanted") else {}
        return tuple(start.get(d, frozenset()) - {g[-1]} for d, g in gears.items())

    def collect(self, runner: object) -> dict[Variant, None]:
        """Keep the variants `runner` saw wanted (`take_wanted`, when it has it) since the last
        call; returns every one kept, oldest first (the caller removes those it is done with)."""
        take = getattr(runner, "take_wanted", None)
        if take is not None:
            wanted = self.wanted
            for variant in take():
                if len(wanted) >= MAX_HELD:
                    break
                wanted[tuple(variant)] = None
        return self.wanted


def defers(variant: Variant, deferred: Deferred) -> bool:
    """Whether a plan with these `deferred` gears leaves `variant` until a request wants it."""
    return any(g in held for g, held in zip(variant, deferred, strict=False))


def undeferred(earlier: Deferred, now: Deferred) -> Deferred:
    """Per dim, the gears an earlier plan deferred that a plan now would not (they left the
    start-up gears, or became the largest): their variants must be planned again."""
    return tuple(e - n for e, n in zip(earlier, now, strict=True)) if earlier else ()
