from __future__ import annotations

import os
import stat

import pytest
from fakeclock import FakeClock

from gearshift.errors import LayoutError, NamespaceBusy
from gearshift.shm import segment
from gearshift.shm.segment import Segment
from shm.procs import layout_table

MAGIC, LAYOUT = 0x1234, 3


@pytest.fixture
def name(namespace: str) -> str:
    return f"/gearshift.{namespace}.snap.0"


def test_layout_table_matches_the_header_constants() -> None:
    assert layout_table(segment.__doc__) == {
        "magic": (segment.MAGIC * 8, 8),
        "layout": (segment.LAYOUT * 8, 8),
        "constants": (segment.CONSTANTS * 8, segment.LINE - segment.CONSTANTS * 8),
    }


def test_created_segments_are_private_and_exclusive(name: str) -> None:
    created = Segment.create(name, 128).seal(MAGIC, LAYOUT, (7, 8))
    try:
        mode = os.stat(os.path.join(segment.SHM_DIR, name[1:])).st_mode
        assert stat.S_IMODE(mode) == 0o600
        with pytest.raises(NamespaceBusy, match="already exists"):
            Segment.create(name, 128)
        attached = Segment.attach(name, MAGIC, LAYOUT)
        assert list(attached.words[:4]) == [MAGIC, LAYOUT, 7, 8]
        attached.close()
    finally:
        assert created.unlink()
        created.close()
    assert not segment.exists(name)
    assert not segment.unlink(name)


@pytest.mark.parametrize(
    ("magic", "layout", "message"),
    [(MAGIC + 1, LAYOUT, "magic"), (MAGIC, LAYOUT + 1, "layout version 3, gearshift reads 4")],
)
def test_attaching_another_structure_or_layout_version_is_refused(
    name: str, magic: int, layout: int, message: str
) -> None:
    created = Segment.create(name, 64).seal(MAGIC, LAYOUT, ())
    try:
        with pytest.raises(LayoutError, match=message):
            Segment.attach(name, magic, layout)
    finally:
        created.unlink()
        created.close()


def test_a_segment_never_initialised_is_refused_after_the_timeout(name: str) -> None:
    created = Segment.create(name, 64)  # creator never seals it
    try:
        with pytest.raises(LayoutError, match="not initialised"):
            Segment.attach(name, MAGIC, LAYOUT, clock=FakeClock(), timeout=0.5)
    finally:
        created.unlink()
        created.close()


def test_attaching_a_missing_segment_is_file_not_found(name: str) -> None:
    with pytest.raises(FileNotFoundError):
        Segment.attach(name, MAGIC, LAYOUT)


def test_close_refuses_while_a_view_is_alive_and_works_after(name: str) -> None:
    created = Segment.create(name, 64).seal(MAGIC, LAYOUT, ())
    created.unlink()
    view = memoryview(created.mm)
    with pytest.raises(BufferError):
        created.close()
    view.release()
    created.mm.close()


def test_header_constants_that_overstate_the_segment_are_refused(name: str) -> None:
    created = Segment.create(name, 64).seal(MAGIC, LAYOUT, (1000,))
    try:
        attached = Segment.attach(name, MAGIC, LAYOUT)
        assert attached.require(True, 64) is attached
        with pytest.raises(LayoutError, match=r"header constants \[1000, 0"):
            attached.require(True, 64 + 1000)  # it unmaps itself before raising
        attached = Segment.attach(name, MAGIC, LAYOUT)
        with pytest.raises(LayoutError, match="do not fit"):
            attached.require(False, 64)
    finally:
        created.unlink()
        created.close()


def test_a_weakly_ordered_cpu_gets_a_sequentially_consistent_fence() -> None:
    atomicshm = pytest.importorskip("atomicshm")  # installed on weakly ordered hosts
    fence = segment.full_fence(True)
    assert (fence.func, fence.args) == (atomicshm.fence, (atomicshm.SEQ_CST,))
    fence()
