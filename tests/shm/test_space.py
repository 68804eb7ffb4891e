"""Segments are reserved whole when created: a full /dev/shm is a SpaceError at creation, never
a SIGBUS when a page is first touched (the tmpfs cases run in a private mount namespace)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from gearshift.controller.footprint import footprint
from gearshift.shm import EventRing, Registry, SnapshotRegion, cleanup, segment
from gearshift.shm.ring import DEFAULT_CAPACITY, RECORD, RECORDS


def _allocated(name: str) -> int:
    return os.stat(segment.path(name)).st_blocks * 512


def test_every_segment_is_allocated_whole_at_creation_as_the_footprint_says(
    namespace: str,
) -> None:
    registry = Registry.create(namespace, slots=4)
    ring = EventRing.create(namespace, 0)
    region = SnapshotRegion.create(namespace, 0)
    try:
        assert _allocated(ring.name) >= RECORDS + DEFAULT_CAPACITY * RECORD
        need = footprint(slots=4, page=os.sysconf("SC_PAGE_SIZE"))
        assert _allocated(ring.name) == need.per_worker
        assert _allocated(region.segment.name) == need.per_device
        assert _allocated(registry.segment.name) <= need.fixed
    finally:
        for made in (ring, region):
            made.close()
        registry.close()
        cleanup(namespace)


NO_ROOM = """
import os, sys
from gearshift.errors import SpaceError
from gearshift.shm import EventRing, segment
ns = sys.argv[1]
small = EventRing.create(ns, 0, 1024)  # 64 KiB of records: fits
try:
    EventRing.create(ns, 1)  # 4 MiB: does not
except SpaceError as e:
    print(e)
assert not segment.exists(f"/gearshift.{ns}.ring.1"), "the half-made ring is left"
fd = os.open("/dev/shm/filler", os.O_WRONLY | os.O_CREAT, 0o600)
try:  # /dev/shm full to the last page
    while os.write(fd, b"x" * 4096):
        pass
except OSError:
    os.close(fd)
for i in range(3 * 1024):  # the ring wraps three times: its every page is already backed
    assert small.put(i, 0, 0, (i,), (1,))
    small.drain()
again = EventRing.attach(ns, 0, timeout=0)
print(len(again.drain()), again.capacity)
"""


def test_no_room_for_a_segment_is_a_space_error_and_a_full_dev_shm_faults_nothing(
    namespace: str, tiny_shm: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    done = tiny_shm([sys.executable, "-c", NO_ROOM, namespace], 1 << 20)
    assert done.returncode == 0, done.stderr[-2000:]  # before: -7, SIGBUS
    refusal, attached = done.stdout.splitlines()
    assert refusal.startswith(f"/dev/shm has no room for /gearshift.{namespace}.ring.1: it "
                              f"needs {RECORDS + DEFAULT_CAPACITY * RECORD} bytes")
    assert "--shm-size" in refusal
    assert attached == "0 1024"


def test_serve_without_room_for_its_own_objects_is_refused_naming_the_one_left_out(
    namespace: str, tiny_shm: Callable[..., subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    page, registry = os.sysconf("SC_PAGE_SIZE"), Registry.create(namespace, slots=4)
    ctl = _allocated(registry.segment.name)  # what the control segment takes, in pages
    registry.close()
    cleanup(namespace)
    serve = (f"{sys.executable} -m gearshift serve -n {namespace} --state-dir {tmp_path} "
             "--set slots=4; echo exit $?; ls /dev/shm")
    for size, missing in ((ctl - page, "ctl"), (ctl, "lock"), (ctl + 2 * page, "status")):
        done = tiny_shm(["sh", "-c", serve], size)
        _, code, *left = done.stdout.split()
        assert code == "1" and not left, (size, done.stdout, done.stderr[-500:])  # none left
        assert f"error: /dev/shm has no room for /gearshift.{namespace}.{missing}: it" in (
            done.stderr)
