"""Only this user's objects are used: another user's (or one open to other users) is refused
by name and owner, never attached, written or removed; another user cannot steer ours."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from multiprocessing.context import BaseContext

import pytest

from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller
from gearshift.errors import NotOwned
from gearshift.shm import EventRing, Registry, SnapshotRegion, cleanup, names, segment
from gearshift.shm.cleanup import own
from gearshift.shm.lock import semaphore_name
from shm.procs import NOBODY, WAIT, Spawn, attack, squat

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a second user")


def _file(name: str) -> str:
    return segment.path(name)


@pytest.fixture
def squatted(namespace: str) -> Iterator[list[str]]:
    """Removes (as root) whatever another user created in the namespace."""
    made: list[str] = []
    yield made
    for name in made:
        if os.path.exists(_file(name)):
            os.unlink(_file(name))


def test_a_segment_open_to_other_users_is_refused_by_name_and_mode(namespace: str) -> None:
    created = SnapshotRegion.create(namespace, 0, 4096)
    try:
        os.chmod(_file(names.snapshot(namespace, 0)), 0o666)
        expected = rf"snap\.0 belongs to uid {os.geteuid()} with mode 0666"
        with pytest.raises(NotOwned, match=expected):
            SnapshotRegion.attach(namespace, 0)
    finally:
        os.chmod(_file(names.snapshot(namespace, 0)), 0o600)
        created.unlink()
        created.close()


def test_a_lock_open_to_other_users_is_refused(namespace: str) -> None:
    registry = Registry.create(namespace, slots=1)
    try:
        os.chmod(_file(semaphore_name(namespace)), 0o644)
        with pytest.raises(NotOwned, match=r"sem\.gearshift\..*\.lock belongs to uid .* mode 0644"):
            Registry.attach(namespace)
    finally:
        os.chmod(_file(semaphore_name(namespace)), 0o600)
        registry.unlink()
        registry.close()


@as_root
def test_another_user_cannot_attach_write_or_remove_our_namespace(
    namespace: str, mp: BaseContext, spawn: Spawn
) -> None:
    registry = Registry.create(namespace, slots=2)
    region = SnapshotRegion.create(namespace, 0, 4096)
    ring = EventRing.create(namespace, registry.claim_slot(0), 8)
    results = mp.Queue()
    try:
        region.publish({"gears": [1, 2]})
        spawn(attack, namespace, results)
        outcomes = results.get(timeout=WAIT)
        for what in ("registry", "snapshot", "ring", "cleanup"):
            kind, message = outcomes[what]
            assert kind == "NotOwned", (what, outcomes[what])
            assert "belongs to uid 0 with mode 0600" in message and "\n" not in message
        assert outcomes["write"][0] == "PermissionsError"
        assert outcomes["unlink"][0] == "PermissionsError"
        assert region.read().payload == {"gears": [1, 2]}  # intact, still ours
        assert registry.slots()[0].alive and segment.exists(ring.name)
    finally:
        ring.unlink()
        ring.close()
        region.unlink()
        region.close()
        registry.unlink()
        registry.close()


@as_root
def test_a_namespace_squatted_by_another_user_is_refused_naming_it_and_its_owner(
    namespace: str, mp: BaseContext, spawn: Spawn, squatted: list[str], tmp_path: object
) -> None:
    ctl, lock = names.control(namespace), names.lock(namespace)
    squatted += [ctl, semaphore_name(namespace)]
    results = mp.Queue()
    spawn(squat, [ctl], lock, results)
    assert results.get(timeout=WAIT) == "squatted"
    expected = rf"{ctl} belongs to uid {NOBODY} with mode 0666"
    with pytest.raises(NotOwned, match=expected):
        Registry.open(namespace, slots=2)
    with pytest.raises(NotOwned, match=expected):
        own(namespace, 2)
    config = ControllerConfig(namespace=namespace, state_dir=str(tmp_path))
    with pytest.raises(NotOwned, match=expected):
        Controller.open(config)
    with pytest.raises(NotOwned, match=expected):  # nothing of it is removed
        cleanup(namespace)
    assert os.stat(_file(ctl)).st_uid == NOBODY
    serve = subprocess.run(
        [sys.executable, "-m", "gearshift", "serve", "-n", namespace, "--state-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=WAIT,
    )
    assert serve.returncode == 4
    (line,) = serve.stderr.strip().splitlines()  # one line, no traceback
    assert line.startswith("error: ") and f"{ctl} belongs to uid {NOBODY}" in line


@as_root
def test_a_squatted_lock_ring_or_region_is_refused(
    namespace: str, mp: BaseContext, spawn: Spawn, squatted: list[str]
) -> None:
    ring, snap = names.ring(namespace, 0), names.snapshot(namespace, 1)
    squatted += [ring, snap, semaphore_name(namespace)]
    results = mp.Queue()
    spawn(squat, [ring, snap], names.lock(namespace), results)
    assert results.get(timeout=WAIT) == "squatted"
    lock = rf"sem\.gearshift\.{namespace}\.lock belongs to uid {NOBODY}"
    with pytest.raises(NotOwned, match=lock):
        Registry.create(namespace)
    assert not segment.exists(names.control(namespace))  # its own half is undone
    with pytest.raises(NotOwned, match=rf"{ring} belongs to uid {NOBODY}"):
        EventRing.create(namespace, 0, 8)
    with pytest.raises(NotOwned, match=rf"{snap} belongs to uid {NOBODY}"):
        SnapshotRegion.open(namespace, 1)


@as_root
def test_cleanup_removes_ours_and_names_what_another_user_left(
    namespace: str, mp: BaseContext, spawn: Spawn, squatted: list[str]
) -> None:
    foreign = names.snapshot(namespace, 7)
    squatted.append(foreign)
    Registry.create(namespace, slots=1).close()
    SnapshotRegion.create(namespace, 0, 4096).close()
    results = mp.Queue()
    spawn(squat, [foreign], None, results)
    assert results.get(timeout=WAIT) == "squatted"
    with pytest.raises(NotOwned, match=r"2 objects removed, 1 left: .*snap\.7 belongs to uid"):
        cleanup(namespace)
    assert not segment.exists(names.control(namespace))
    assert not segment.exists(names.snapshot(namespace, 0))
    assert not os.path.exists(_file(semaphore_name(namespace)))
    assert segment.exists(foreign)
