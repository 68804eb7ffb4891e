"""The controller word of a namespace's control segment (control.py has the layout): who is
the controller, claimed under the lock, judged by lease.py, beaten every loop iteration.

A controller of this process's realm is judged by its identity; one of another realm by its
lease (`controller_beats`, watched by the registry's `Watch`). `claim_controller` takes the word
from a dead one only: of another realm, once its lease expired while this process watched; it
refuses as soon as a beat shows the other alive. A controller that finds the word taken
(`owns_controller` false: another judged it dead, e.g. after a stop longer than the lease)
stops; it never claims it back, so two live controllers never both act.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from gearshift.clock import Clock
from gearshift.errors import ControllerNotFound, ControllerRunning
from gearshift.shm import lease, liveness
from gearshift.shm.lease import Watch
from gearshift.shm.slotinfo import ControllerInfo, is_alive

CLOSED, CONTROLLER, CONTROLLER_BEAT = 40, 64, 72  # byte offsets (control.py's table)
CONTROLLER_REALM, CONTROLLER_BEATS = 112, 120
KEY = "controller"  # the controller's key in a Watch (slots are keyed by number)
_WORD = (1 << 64) - 1


class Leadership:
    """The controller-word methods of `control.Registry`."""

    namespace: str
    watch: Watch
    clock: Clock
    _me: int

    def _locked(self) -> AbstractContextManager[None]: ...  # control.Registry's
    def _word(self, offset: int) -> int: ...
    def _set(self, offset: int, value: int) -> None: ...

    def claim_controller(self, wait: float = 0.0) -> None:
        """Make this process the controller; ControllerNotFound if the namespace was closed for
        removal; ControllerRunning if another live one is: of this realm, at once; of another
        realm, as soon as a beat shows it alive, and while its lease has not expired within
        `wait` seconds of watching (a takeover from a controller of another realm needs a
        `wait` of at least lease.LEASE)."""
        me, mine = liveness.current(), liveness.realm()
        start, first = self.clock.now(), None
        while True:
            with self._locked():
                if self._word(CLOSED):
                    raise ControllerNotFound(f"namespace {self.namespace!r} is being cleaned up")
                owner, realm = self._word(CONTROLLER), self._word(CONTROLLER_REALM)
                beats, now = self._word(CONTROLLER_BEATS), self.clock.now()
                if (owner == me and realm == mine) or not is_alive(
                        owner, realm, KEY, beats, self.watch, now):
                    self._set(CONTROLLER_REALM, mine)  # before the identity it qualifies
                    self._set(CONTROLLER, me)
                    self._me = me
                    lease.renewer.add((id(self), "controller"), self.renew_controller)
                    return
            first = first or (owner, beats)
            if realm == mine or first != (owner, beats) or now - start >= wait:
                raise ControllerRunning(self.namespace, liveness.pid_of(owner))
            self.clock.sleep(min(0.05, wait))

    def renew_controller(self) -> None:
        """Bump the controller's lease while the word names this process (lease.renewer's)."""
        if self.owns_controller():
            self._set(CONTROLLER_BEATS, (self._word(CONTROLLER_BEATS) + 1) & _WORD)

    def owns_controller(self) -> bool:
        """Whether the controller word still names this process since `claim_controller` (one
        read: the controller checks it every iteration; if another took over, it stops)."""
        return self._me != 0 and self._word(CONTROLLER) == self._me

    def release_controller(self) -> None:
        """Clear the controller word if it names this process; without the lock (it may be
        held by a stopped or dead process): while this process lives, no claimant writes it."""
        lease.renewer.remove((id(self), "controller"))
        if self._word(CONTROLLER) == liveness.current() and (
                self._word(CONTROLLER_REALM) == liveness.realm()):
            self._set(CONTROLLER, 0)

    def controller(self) -> ControllerInfo:
        """The controller as this process judges it (lease.py: one of another realm reads as
        alive until this registry's watch saw its lease expire)."""
        owner, realm = self._word(CONTROLLER), self._word(CONTROLLER_REALM)
        beats = self._word(CONTROLLER_BEATS)
        alive = is_alive(owner, realm, KEY, beats, self.watch, self.clock.now())
        foreign = owner != 0 and realm != liveness.realm()
        return ControllerInfo(
            liveness.pid_of(owner), alive, self._word(CONTROLLER_BEAT), owner, foreign
        )

    def controller_beats(self) -> int:
        """The controller's lease counter as it reads now (two readings apart in time tell
        whether it beats)."""
        return self._word(CONTROLLER_BEATS)

    def beat_controller(self, now_ns: int) -> None:
        """The controller's heartbeat (its clock, for display) and lease beat."""
        self._set(CONTROLLER_BEAT, now_ns)
        self._set(CONTROLLER_BEATS, (self._word(CONTROLLER_BEATS) + 1) & _WORD)


