"""The publication journal: what the controller journals, how it is read back, and which
accepted snapshots are torn."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gearshift.shm import SnapshotRegion, codec
from gearshift.tools.stress.journal import RECORD, Journal, JournaledRegion, torn


@pytest.fixture
def region(namespace: str, tmp_path: Path) -> Iterator[SnapshotRegion]:
    JournaledRegion.journal = os.open(tmp_path / "journal.0", os.O_WRONLY | os.O_CREAT)
    made = JournaledRegion.create(namespace, 3)
    yield made
    made.unlink()
    made.close()
    os.close(JournaledRegion.journal)


def test_each_publication_is_journaled_under_the_version_it_gets(
    region: SnapshotRegion, tmp_path: Path
) -> None:
    first, second = {"device": 3, "n": 1}, {"device": 3, "n": 2}
    assert region.publish(first) == 1
    assert region.publish(second, at_least=7) == 7  # a restarted controller's jump
    entries = Journal(tmp_path).refresh().entries
    assert sorted(entries) == [(3, 1), (3, 7)]
    assert [codec.unpack(p, len(p)) for _, p in entries[3, 1] + entries[3, 7]] == [first, second]
    assert entries[3, 1][0][0] <= entries[3, 7][0][0]  # publication times


def test_the_journal_reads_only_complete_records_across_files(tmp_path: Path) -> None:
    payload = codec.pack({"device": 0})
    record = RECORD.pack(0, 4, 123, len(payload)) + payload
    (tmp_path / "journal.0").write_bytes(record + record[:-1])  # a controller killed mid-write
    (tmp_path / "journal.1").write_bytes(record[:10])
    journal = Journal(tmp_path).refresh()
    assert journal.entries == {(0, 4): [(123, payload)]}
    with open(tmp_path / "journal.1", "ab") as f:
        f.write(record[10:])  # the rest arrives
    assert journal.payloads(0, 4) == [{"device": 0}]  # read once complete
    assert journal.refresh().entries[0, 4] == [(123, payload)] * 2


def test_torn_is_anything_but_a_published_payload_of_a_version_that_never_goes_back(
    tmp_path: Path,
) -> None:
    v5, other = {"device": 1, "g": [1, 2]}, {"device": 1, "g": [1, 3]}
    data = codec.pack(v5)
    (tmp_path / "journal.0").write_bytes(RECORD.pack(1, 5, 0, len(data)) + data)
    journal = Journal(tmp_path)
    assert torn(1, 5, v5, (4, {}), journal) == ""
    assert torn(1, 5, v5, (5, v5), journal) == ""
    assert torn(1, 5, other, (5, v5), journal) == "another_payload_under_the_same_version"
    assert torn(1, 4, v5, (5, v5), journal) == "version_went_down_from_5"
    assert torn(1, 5, other, (4, {}), journal) == "not_published"
    assert torn(1, 6, v5, (5, v5), journal) == "not_published"
    assert torn(2, 5, v5, (4, {}), journal) == "another_device"
    assert torn(1, 5, [1], (4, {}), journal) == "another_device"
