"""The tests' clock: virtual time that `sleep` and `advance` move at once; thread-safe.

Tests inject it wherever a component takes a `Clock` (never patching `time.*`). It is the
product's `ManualClock` (the stress harness steps a controller on it), named for its role here.
"""

from __future__ import annotations

from gearshift.clock import ManualClock


class FakeClock(ManualClock):
    """Virtual time for tests: `sleep` advances `now` instantly; thread-safe."""
