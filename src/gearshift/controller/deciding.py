"""Where the controller's decision rounds run: off the loop, on a snapshot of the ledger.

`Decider.start` takes a device's ledger as it is (`DeviceLedger.snapshot`: gears and
statistics by reference, so the loop goes on draining and folding into the live statistics)
and runs `core.round.decide_round` on it in a thread of its own, at most one per device.
`finished(ledgers)`, every loop iteration, hands back the rounds that are done (`Decided`),
for the loop to apply. A round decided on gears that changed meanwhile (a round applied, a
profile registered, replaced or dropped) is stale: never handed back, counted (`stale`), its
device put in `redo` for the loop to decide again at once. The policy is pure, so a round
decided on the snapshot is the one the live ledger would have given at the same `now`. With
`background=False` the round runs in the caller, done when `start` returns (a fake clock's
tests: the same step decides and publishes). Errors (a profile's, or the round's) are kept
with the round, never raised in the thread, and reported to `failed` by `finished`. A thread
is a daemon: `close` does not wait for it (the round is pure; its result is dropped).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from gearshift import threads
from gearshift.clock import Clock
from gearshift.core.config import PolicyConfig
from gearshift.core.costs import Prices
from gearshift.core.fleet import Views
from gearshift.core.round import DeviceLedger, ProfileLedger, Round, decide_round


@dataclass
class Decided:
    """One device's round as decided on a snapshot: `round` (None: none due or none decided),
    the policy's `seconds`, each profile's error (`errors`: name, error) and the round's own
    (`error`: the round failed as a whole)."""

    device: int
    now: float
    usage: float | None
    base: tuple[float | None, list[tuple[str, ProfileLedger, object]]]  # decided on this
    round: Round | None = None
    seconds: float = 0.0
    errors: list[tuple[str, Exception]] = field(default_factory=list)
    error: Exception | None = None

    def stale(self, ledger: DeviceLedger) -> bool:
        """Whether `ledger`'s gears changed since the snapshot: its last update, or a profile
        or a profile's gears, is not the one the round was decided on."""
        last, profiles = self.base
        return (ledger.last_update != last or len(profiles) != len(ledger.profiles)
                or any(ledger.profiles.get(name) is not p or p.gears is not gears
                       for name, p, gears in profiles))


def _base(ledger: DeviceLedger) -> tuple[float | None, list[tuple[str, ProfileLedger, object]]]:
    """What a round's validity rests on (`Decided.stale`), held by reference."""
    return ledger.last_update, [(n, p, p.gears) for n, p in ledger.profiles.items()]


class Decider:
    """The decision rounds of one controller (module docstring)."""

    def __init__(self, policy: PolicyConfig, clock: Clock, background: bool,
                 failed: Callable[[str, Exception], None]) -> None:
        self.policy, self.clock, self.background, self.failed = policy, clock, background, failed
        self.stale = 0  # rounds discarded: the gears changed while they were decided
        self.redo: set[int] = set()  # devices whose round was stale: decide again now
        self._running: dict[int, tuple[threading.Thread, Decided]] = {}
        self._done: list[Decided] = []

    def busy(self, device: int) -> bool:
        """Whether a round of `device` is being decided or waits to be applied."""
        return device in self._running or any(d.device == device for d in self._done)

    def start(self, device: int, ledger: DeviceLedger, now: float, usage: float | None,
              prices: Mapping[str, Mapping[str, Prices]],
              prior: Mapping[str, Mapping[str, Views]] | None = None) -> None:
        """Decide `device`'s round at `now` on a snapshot of `ledger` (not while `busy`), the
        fleet's `prior` added to its statistics (`core.round.decide_round`)."""
        assert not self.busy(device)
        self.redo.discard(device)
        decided = Decided(device, now, usage, _base(ledger))
        snapshot = ledger.snapshot()
        if not self.background:
            self._decide(decided, snapshot, prices, prior)
            self._done.append(decided)
            return
        thread = threading.Thread(target=self._decide, args=(decided, snapshot, prices, prior),
                                  name=f"gearshift-round-{device}", daemon=True)
        self._running[device] = (thread, decided)
        threads.start(thread)

    def finished(self, ledgers: Mapping[int, DeviceLedger]) -> list[Decided]:
        """The rounds decided since the last call on their device's gears as they are in
        `ledgers`, in the order they finished; errors reported, stale rounds left out."""
        for device, (thread, decided) in list(self._running.items()):
            if not thread.is_alive():
                del self._running[device]
                self._done.append(decided)
        done, self._done = self._done, []
        current = []
        for decided in done:
            device = decided.device
            for name, e in decided.errors:
                self.failed(f"decision round of {device}/{name}", e)
            if decided.error is not None:
                self.failed(f"decision round of device {device}", decided.error)
            elif device in ledgers and decided.stale(ledgers[device]):
                self.stale += 1
                self.redo.add(device)
            elif device in ledgers:
                current.append(decided)
        return current

    def close(self) -> None:
        """Forget every round in flight (their threads end on their own)."""
        self._running.clear()
        self._done.clear()
        self.redo.clear()

    def _decide(self, decided: Decided, ledger: DeviceLedger,
                prices: Mapping[str, Mapping[str, Prices]],
                prior: Mapping[str, Mapping[str, Views]] | None = None) -> None:
        began = self.clock.now()
        try:
            decided.round = decide_round(ledger, decided.now, decided.usage, self.policy,
                                         lambda name, e: decided.errors.append((name, e)),
                                         prices, prior)
        except BaseException as e:  # whatever it is, the loop reports it
            decided.error = e if isinstance(e, Exception) else RuntimeError(repr(e))
        decided.seconds = self.clock.now() - began
