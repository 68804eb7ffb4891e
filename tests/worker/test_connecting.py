"""`gs.connect()`: what it reads of the environment when not told (`GEARSHIFT_NAMESPACE`,
`GEARSHIFT_STATE_DIR` for an embedded controller), an argument winning over it."""

from __future__ import annotations

from pathlib import Path

import pytest

import gearshift as gs
from gearshift.controller.statefile import STATE_FILE
from gearshift.graphs import streams
from gearshift.shm import SlotState
from worker.fake_controller import FakeController, wait_until


def test_connect_without_a_namespace_reads_gearshift_namespace_and_an_argument_wins(
    fake: FakeController, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GEARSHIFT_NAMESPACE", fake.namespace)
    with gs.connect(background=False, register_timeout=0, require_controller=True) as client:
        assert client.namespace == fake.namespace  # its controller's, not "default"
        assert fake.registry.slots()[client.slot].state == SlotState.ACTIVE
    other = f"{fake.namespace}other"
    with gs.connect(other, background=False) as client:
        assert client.namespace == other and client.slot is None


def test_an_embedded_controller_keeps_its_state_in_gearshift_state_dir(
    namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GEARSHIFT_STATE_DIR", str(tmp_path))
    with gs.connect(namespace, embedded=True) as client:
        prof = client.profile("decode", {"BATCHSIZE": gs.Dim(gears=[1, 64], max=64)})
        wait_until(lambda: prof.version >= 1)
    assert STATE_FILE in [p.name for p in tmp_path.iterdir()]


def test_the_npu_stream_ledgers_are_the_open_clients_namespaces_only(fake: FakeController) -> None:
    """A client installs its namespace's stream ledgers for the process's npu backends and its
    close removes them (a backend made later opened a ledger in a namespace whose clients were
    gone: a /dev/shm entry no cleanup of a live namespace removes); a second client of the same
    namespace keeps them until it closes too."""
    first = gs.connect(fake.namespace, background=False, register_timeout=0)
    with gs.connect(fake.namespace, background=False, register_timeout=0):
        first.close()
        ledger = streams.ledger(0)
        assert ledger is not None and ledger.budget == streams.NPU_BUDGET
        ledger.unlink()
        ledger.close()
    assert streams.ledger(0) is None
