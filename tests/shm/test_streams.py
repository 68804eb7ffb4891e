"""The stream ledger (shm/streams.py): the processes of a device share its budget, with real
processes on real shared memory."""

from __future__ import annotations

from collections.abc import Iterator
from multiprocessing.context import BaseContext

import pytest

from gearshift.errors import LayoutError
from gearshift.shm import names, streams
from gearshift.shm.segment import CONSTANTS, LINE, Segment
from gearshift.shm.streams import IDENT, LAYOUT, MAGIC, PIDNS, STREAMS, WORDS, StreamLedger
from shm import stream_procs
from shm.procs import WAIT, Spawn, layout_table


@pytest.fixture
def ledger(namespace: str) -> Iterator[StreamLedger]:
    opened = StreamLedger.open(namespace, 0, budget=10)
    yield opened
    opened.unlink()
    opened.close()


def test_the_processes_of_a_device_share_its_budget(
    ledger: StreamLedger, namespace: str, spawn: Spawn, mp: BaseContext
) -> None:
    held, go = mp.Event(), mp.Event()
    child = spawn(stream_procs.hold, namespace, 10, 6, held, go)
    assert held.wait(WAIT)
    assert ledger.take(5) == 6  # refused: the child holds 6 of 10
    assert ledger.take(4) is None and ledger.total() == 10 and ledger.held == 4
    ledger.give(1)
    assert ledger.total() == 9
    go.set()
    child.join(WAIT)
    assert child.exitcode == 0
    assert ledger.total() == 3  # a dead process's streams are cleared
    assert ledger.take(7) is None and ledger.take(1) == 0


def test_each_opening_has_an_entry_and_a_corrupt_one_counts_nothing(
    ledger: StreamLedger, namespace: str
) -> None:
    other = StreamLedger.open(namespace, 0, budget=99)  # the creator's budget stands
    try:
        assert other.budget == 10
        assert other.take(3) is None and ledger.take(8) == 3 and ledger.take(7) is None
        other.seg.words[(1 + 0) * WORDS + STREAMS] = 1 << 40  # other's entry, corrupted
        assert ledger.total() == 7
    finally:
        other.close()


def test_a_header_out_of_bounds_is_refused(namespace: str) -> None:
    name = names.streams(namespace, 1)
    seg = Segment.create(name, LINE * 2).seal(MAGIC, LAYOUT, [1 << 20, 10])
    try:
        with pytest.raises(LayoutError, match="do not fit"):
            StreamLedger.open(namespace, 1, budget=10)
        assert seg.words[CONSTANTS] == 1 << 20
    finally:
        seg.unlink()
        seg.close()


def test_layout_table_matches_the_code() -> None:
    """The docstring's table is the ledger's one layout (docs/architecture.md links to it)."""
    table = layout_table(streams.__doc__, i=3)
    assert table["header"] == (0, LINE)
    for field, word in (("ident[i]", IDENT), ("streams[i]", STREAMS), ("pidns[i]", PIDNS)):
        assert table[field] == (((1 + 3) * WORDS + word) * 8, 8), field
