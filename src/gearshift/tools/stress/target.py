"""What the fuzzer attacks (`fuzz.py`): a `Live` namespace and the `Tally` of what went wrong.

A `Live` is a `Controller` of its own, stepped on a ManualClock in this process, with one live
`Client` routing on profile "fuzz", and a hostile worker (a slot and ring of its own). After an
attack (`boundaries.py`) the loop runs on and requests are routed (`run`); then everything is
closed and the namespace must be gone. A case counts, per boundary:

- crashes: an exception out of `Controller.step` or `close`, or out of `Controller.open` other
  than the typed refusal of a bad file (StateError, ConfigError: counted `refused`);
- request_errors: an exception out of a `route()` of valid sizes;
- stalls: a controller iteration over STALL_SECONDS of wall time that blocked or kept its CPU
  (one that only lost its CPU to other processes is counted `interrupted`);
- out_of_bounds: a gear outside its dim's bounds in the controller's ledgers, the published
  snapshot or the client's gears in use;
- leaked: shared-memory objects of the namespace left after both closed;
- lost: recorded events never consumed (the deployment faults of `faults`);
- unserved: a worker joining after the attack got no answer to its registration (a typed
  refusal, such as a namespace a participant marked closed, is an answer); the live client's
  own registration is checked likewise after a configuration was accepted;
- trusted: a file of a hostile state directory followed or written (`fault_boundaries`).

Failures are tallied with a short description, never raised.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from resource import RUSAGE_THREAD, getrusage
from typing import Any

from gearshift import protocol
from gearshift.clock import ManualClock, MonotonicClock
from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller
from gearshift.controller.statefile import STATE_FILE
from gearshift.core.config import PolicyConfig
from gearshift.core.dims import Dim
from gearshift.errors import ConfigError, GearshiftError, StateError
from gearshift.shm import EventRing, Registry, SnapshotRegion, cleanup, lock, names, segment
from gearshift.worker.session import Client

STALL_SECONDS = 0.1
STEPS = 8  # controller iterations after an attack
DIMS = {"S": Dim(gears=[8, 64, 512], max=4096, splittable=True), "B": Dim(gears=[1, 4, 16], max=16)}
SIZES = ((1, 1), (37, 3), (512, 16), (1500, 16))  # (S, B) routed after every attack
POLICY = PolicyConfig(window_seconds=4.0, half_life_seconds=2.0, slice_seconds=0.25,
                      update_interval_seconds=0.2, check_interval_seconds=0.1,
                      recent_use_protect_seconds=0.5)
REFUSALS = (StateError, ConfigError)  # a bad file, refused at open: not a crash
LIVE_SLOTS = 2  # a Live's worker slots: its client's and its hostile worker's
WALL = MonotonicClock()
serial = itertools.count()  # namespaces of this process


@dataclass
class Tally:
    """The outcome of one boundary's cases; `failures` describes the first few."""

    cases: int = 0
    refused: int = 0
    crashes: int = 0
    request_errors: int = 0
    stalls: int = 0
    out_of_bounds: int = 0
    leaked: int = 0
    lost: int = 0  # recorded events never consumed (the deployment faults')
    unserved: int = 0
    trusted: int = 0  # a file of a hostile state directory followed or written
    interrupted: int = 0  # iterations over STALL_SECONDS that only lost their CPU
    failures: list[str] = field(default_factory=list)

    FIGURES = ("cases", "refused", "crashes", "request_errors", "stalls", "out_of_bounds",
               "leaked", "lost", "unserved", "trusted", "interrupted")

    def fail(self, figure: str, what: str) -> None:
        setattr(self, figure, getattr(self, figure) + 1)
        if len(self.failures) < 10:
            self.failures.append(f"{figure}: {what}"[:300])

    @property
    def clean(self) -> bool:
        return not (self.crashes or self.request_errors or self.stalls or self.out_of_bounds
                    or self.leaked or self.lost or self.unserved or self.trusted)

    def figures(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.FIGURES}


class SteppingClock(ManualClock):
    """Virtual time in which the controller runs whenever the client waits."""

    step: Callable[[], None] = staticmethod(lambda: None)

    def sleep(self, seconds: float) -> None:
        self.step()
        super().sleep(seconds)


class Live:
    """A namespace with its controller, a client routing on profile "fuzz" and a hostile
    worker (`registry`, `slot`, `ring`), all in this process; `tally` counts what goes wrong."""

    def __init__(self, tally: Tally, directory: Path, policy: PolicyConfig = POLICY,
                 config: ControllerConfig | None = None, fresh: bool = False,
                 controller: type[Controller] = Controller) -> None:
        self.tally = tally
        self.namespace = f"fuzz{os.getpid()}x{next(serial)}"
        base = config or ControllerConfig()
        self.config = ControllerConfig(**{**base.__dict__, "namespace": self.namespace,
                                          "state_dir": str(directory), "metrics_port": None})
        self.clock = SteppingClock(WALL.now())
        self.controller = controller.open(self.config, policy, clock=self.clock,
                                          fresh_on_corrupt_state=fresh)
        try:
            self.clock.step = self.step  # type: ignore[method-assign]
            self.client = Client(Registry.attach(self.namespace), 0, clock=self.clock,
                                 background=False, register_timeout=1.0)
            self.profile = self.client.profile("fuzz", DIMS)
            if not self.profile.registered:
                tally.fail("unserved", "the live client's registration got no reply")
            self.registry = Registry.attach(self.namespace)
            self.slot = self.registry.claim_slot(0)
            self.ring = EventRing.create(self.namespace, self.slot, 64)
        except BaseException:
            self.controller.close()
            remove(self.namespace)
            raise
        self.step()

    def hostile(self, message: dict) -> dict | None:
        """Post `message` from the hostile worker; its reply after a few iterations."""
        self.registry.requests(self.slot).post(message)
        for _ in range(3):
            self.step()
        return self.registry.replies(self.slot).take()

    def step(self) -> None:
        """One controller iteration, timed; a failure out of it is a crash. An iteration over
        STALL_SECONDS stalled if it blocked (a voluntary context switch) or kept its CPU; one
        that lost its CPU to other processes was only `interrupted` (as `gearshift stress`
        tells them apart)."""
        began, cpu, blocked = WALL.now(), time.thread_time(), getrusage(RUSAGE_THREAD).ru_nvcsw
        try:
            self.controller.step()
        except Exception as e:
            self.tally.fail("crashes", f"step: {type(e).__name__}: {e}")
        took, used = WALL.now() - began, time.thread_time() - cpu
        if took > STALL_SECONDS:
            if getrusage(RUSAGE_THREAD).ru_nvcsw == blocked and took - used > STALL_SECONDS / 2:
                self.tally.interrupted += 1
            else:
                self.tally.fail("stalls", f"step took {took * 1e3:.0f} ms ({used * 1e3:.0f} ms "
                                          "of CPU)")

    def region(self) -> SnapshotRegion:
        return self.controller.regions.devices[0]

    def run(self, steps: int = STEPS) -> None:
        """The loop goes on: steps, swap-thread ticks, requests; then the bounds are checked."""
        for _ in range(steps):
            self.clock.advance(0.05)
            self.step()
            with contextlib.suppress(Exception):  # the swap thread logs and goes on likewise
                self.client._tick()
            for s, b in SIZES:
                try:
                    self.profile.route(S=s, B=b)
                except Exception as e:
                    self.tally.fail("request_errors", f"route: {type(e).__name__}: {e}")
        self.check_bounds()
        self.check_newcomer()

    def check_newcomer(self) -> None:
        """A worker that joins after the attack is served: registered, or refused by name."""
        try:
            probe = Client(Registry.attach(self.namespace), 0, clock=self.clock,
                           background=False, register_timeout=1.0)
        except GearshiftError:
            return  # refused in one typed line (e.g. a namespace marked closed)
        try:
            if not probe.profile("probe", {"B": Dim(max=16)}).registered:
                self.tally.fail("unserved", "a worker joining after the attack got no reply")
        except GearshiftError:
            pass
        finally:
            probe.close()

    def check_bounds(self) -> None:
        for device, dev in self.controller.devices.items():
            for name, p in dev.profiles.items():
                for d, dim in p.dims.items():
                    _in_bounds(self.tally, f"ledger {device}/{name}/{d}", p.gears[d].gears, dim)
        try:
            snap = SnapshotRegion.attach(self.namespace, 0)
        except (FileNotFoundError, GearshiftError):
            snap = None
        if snap is not None:
            with contextlib.suppress(GearshiftError):
                read = snap.read()
                published = protocol.profile_gears(read.payload, "fuzz") if read else None
                for d, gears in (published or {}).items():
                    if d in DIMS and self.controller.devices.get(0):
                        _in_bounds(self.tally, f"published {d}", gears, DIMS[d])
            snap.close()
        for d, gears in self.profile.gears.items():
            _in_bounds(self.tally, f"client {d}", gears, DIMS[d])

    def close(self) -> None:
        """Close everything; the namespace must be gone."""
        with contextlib.suppress(Exception):
            self.ring.close()
            self.registry.release_slot(self.slot)
        with contextlib.suppress(Exception):
            self.registry.close()
        with contextlib.suppress(Exception):
            self.client.close()
        try:
            self.controller.close()
        except Exception as e:
            self.tally.fail("crashes", f"close: {type(e).__name__}: {e}")
        left = objects(self.namespace)
        if left:
            self.tally.fail("leaked", ", ".join(left))
            remove(self.namespace)


def _in_bounds(tally: Tally, where: str, gears: Any, dim: Dim) -> None:
    ok = (isinstance(gears, tuple) and len(gears) > 0
          and all(isinstance(g, int) and dim.min <= g <= dim.max for g in gears)
          and list(gears) == sorted(set(gears)))
    if not ok:
        tally.fail("out_of_bounds", f"{where}: {str(gears)[:80]} outside [{dim.min}, {dim.max}]")


def objects(namespace: str) -> list[str]:
    """The /dev/shm entries of `namespace`: its segments and its lock."""
    pattern, sem = names.segment_pattern(namespace), lock.semaphore_name(namespace)[1:]
    return sorted(n for n in os.listdir(segment.SHM_DIR) if pattern.fullmatch(n) or n == sem)


def remove(namespace: str) -> None:
    """Remove what a failed case left, whatever state it is in."""
    with contextlib.suppress(GearshiftError, OSError):
        cleanup(namespace)
    for entry in objects(namespace):
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(segment.SHM_DIR, entry))


@contextlib.contextmanager
def live(tally: Tally, state: bytes | None = None, **options: Any) -> Iterator[Live | None]:
    """A `Live` in a fresh directory (holding `state` as its state file), closed at the end;
    None when its opening was refused (counted), a crash counted when it failed otherwise."""
    # in memory: a state save's fsync on a busy disk would pass for a stall of the loop
    with tempfile.TemporaryDirectory(prefix="gearshift-fuzz-", dir=segment.SHM_DIR) as directory:
        if state is not None:
            (Path(directory) / STATE_FILE).write_bytes(state)
        try:
            made = Live(tally, Path(directory), **options)
        except REFUSALS:
            tally.refused += 1
            yield None
            return
        except Exception as e:
            tally.fail("crashes", f"open: {type(e).__name__}: {e}")
            yield None
            return
        try:
            yield made
        finally:
            made.close()


