"""Deployment faults `fuzz` attacks beside the boundaries (`faults()`; `faults` runs those that need
real processes), each a hypothesis strategy of cases and the attack that plays one against a
`target.Live` namespace:

- oversize registrations: a controller whose device region holds a drawn capacity (1-64 KiB)
  takes registrations of drawn sizes (dims, gears, gear magnitudes, name lengths) from the
  hostile worker. Each is answered (registered, or refused as a PayloadError or NamespaceBusy),
  the published snapshot holds exactly the profiles of the controller's ledger (none kept that
  was refused), a newcomer is served, and a controller restarted on the saved state opens and
  publishes them.
- hostile state directory: the state directory writable by others or a symlink, or its lock or
  state file a symlink to a victim file, a FIFO, a directory or an 8 GB sparse file. The
  controller opens or refuses in one typed error (UnsafeStateDir, StateError), a refused state
  file starts fresh with --fresh-on-corrupt-state, and the victim (drawn bytes) is never
  written (`trusted`).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import msgpack

from gearshift import protocol
from gearshift.controller.controller import Controller
from gearshift.controller.statefile import LOCK_FILE, STATE_FILE
from gearshift.core.dims import Dim
from gearshift.errors import GearshiftError
from gearshift.shm import SnapshotRegion, names, segment
from gearshift.tools.stress.boundaries import Boundary, strategies
from gearshift.tools.stress.target import POLICY, Live, Tally, live

MAILBOX_BYTES = 6000  # of gears a registration carries: with its names, it fits 8 KiB
ANSWERS = {"PayloadError", "NamespaceBusy"}  # the refusals an oversize registration may get


def sized(capacity: int) -> type[Controller]:
    """A Controller whose device regions hold `capacity` payload bytes."""

    class Region(SnapshotRegion):
        @classmethod
        def open(cls, namespace: str, device: int) -> SnapshotRegion:
            return cls.open_named(names.snapshot(namespace, device), capacity)

    return type("Sized", (Controller,), {"region_type": Region})


def _dims(ndims: int, count: int, start: int) -> dict[str, Dim]:
    each = max(1, min(count, MAILBOX_BYTES // (ndims * len(msgpack.packb(start + count)))))
    return {f"D{k}": Dim(gears=range(start, start + each), max=start + each)
            for k in range(ndims)}


def _oversize(case: tuple[int, list[tuple[int, int, int, int]]], tally: Tally) -> None:
    capacity, profiles = case
    with live(tally, controller=sized(capacity)) as lv:
        if lv is None:
            return
        for local, (ndims, count, start, length) in enumerate(profiles, start=1):
            name = f"p{local}".ljust(length, "x")
            reply = lv.hostile(protocol.register_message(local, name, _dims(ndims, count, start)))
            if reply is None:
                tally.fail("unserved", f"no reply to a registration of {ndims} dims x {count}")
            elif "error" in reply:
                if reply["error"] not in ANSWERS:
                    tally.fail("crashes", f"registration: {reply['error']}: {reply['message']}")
                tally.refused += 1
        lv.run()
        _published_is_kept(lv, tally)
        lv.controller.close()  # a restart on what it saved
        try:
            lv.controller = type(lv.controller).open(lv.config, POLICY, clock=lv.clock)
        except Exception as e:
            tally.fail("crashes", f"restart: {type(e).__name__}: {str(e)[:200]}")
            return
        lv.run(2)
        _published_is_kept(lv, tally)


def _published_is_kept(lv: Live, tally: Tally) -> None:
    kept = set(lv.controller.devices.get(0, {}).profiles) if lv.controller.devices else set()
    try:
        region = SnapshotRegion.attach(lv.namespace, 0)
    except (OSError, GearshiftError):
        return
    try:
        snap = region.read()
    finally:
        region.close()
    published = set(snap.payload["profiles"]) if snap is not None else set()
    if published != kept:
        tally.fail("out_of_bounds", f"published profiles {sorted(published)[:4]} are not the "
                                    f"ledger's {sorted(kept)[:4]}")


HOSTILE = ("dir world-writable", "dir group-writable", "dir symlink", "lock symlink",
           "state symlink", "state fifo", "state directory", "state 8 GB")


def _hostile_directory(case: tuple[str, bytes], tally: Tally) -> None:
    kind, precious = case
    with tempfile.TemporaryDirectory(prefix="gearshift-fuzz-", dir=segment.SHM_DIR) as top:
        victim, real = Path(top) / "victim", Path(top) / "state"
        victim.write_bytes(precious)
        real.mkdir(mode=0o700)
        directory = _make(kind, Path(top), real, victim)
        for fresh in (False, True):
            try:
                made = Live(tally, directory, fresh=fresh)
            except GearshiftError:
                tally.refused += 1
                continue
            except Exception as e:
                tally.fail("crashes", f"open ({kind}): {type(e).__name__}: {str(e)[:200]}")
                continue
            try:
                made.run(2)
            finally:
                made.close()
            break
        if victim.read_bytes() != precious:
            tally.fail("trusted", f"{kind}: the victim file was written")


def _make(kind: str, top: Path, real: Path, victim: Path) -> Path:
    """Make `real` hostile as `kind` says; the directory to give the controller."""
    if kind == "dir world-writable":
        real.chmod(0o777)
    elif kind == "dir group-writable":
        real.chmod(0o770)
    elif kind == "dir symlink":
        (top / "link").symlink_to(real)
        (real / LOCK_FILE).symlink_to(victim)
        return top / "link"
    elif kind == "lock symlink":
        (real / LOCK_FILE).symlink_to(victim)
    elif kind == "state symlink":
        (real / STATE_FILE).symlink_to(victim)
    elif kind == "state fifo":
        os.mkfifo(real / STATE_FILE)
    elif kind == "state directory":
        (real / STATE_FILE).mkdir()
    else:
        with open(real / STATE_FILE, "wb") as f:
            f.truncate(8 << 30)
    if kind.startswith("dir "):
        (real / LOCK_FILE).unlink(missing_ok=True)
        (real / LOCK_FILE).symlink_to(victim)
    return real


def faults() -> tuple[Boundary, ...]:
    """Every deployment fault, its cases drawn by hypothesis (imported here: `strategies`)."""
    st = strategies()
    return (
        Boundary("oversize registrations", st.tuples(
            st.integers(1, 64).map(lambda k: k * 1024),
            st.lists(st.tuples(st.integers(1, 4), st.integers(1, 2400),
                               st.sampled_from([1, 200, 70_000, 2**33]), st.integers(1, 256)),
                     min_size=1, max_size=10)), _oversize),
        Boundary("hostile state dir", st.tuples(st.sampled_from(HOSTILE), st.binary(max_size=64)),
                 _hostile_directory),
    )
