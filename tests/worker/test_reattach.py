"""A client re-attaches when what it mapped is gone: its namespace removed under it (systemd's
RemoveIPC, an operator's rm) and created again by a restarted controller, or its slot reclaimed
by a judge that took it for dead. Before, it wrote into its unlinked ring for good."""

from __future__ import annotations

import logging
import os

import pytest
from fakeclock import FakeClock

import gearshift as gs
from gearshift.shm import Registry, SlotState, control, names, segment
from worker.fake_controller import FakeController, wait_until
from worker.procs import DECODE


def _remove_ipc(namespace: str) -> None:
    """What RemoveIPC does to a namespace: every name unlinked, mappings left in place."""
    for entry in os.listdir(segment.SHM_DIR):
        if namespace in entry:
            os.unlink(os.path.join(segment.SHM_DIR, entry))


def test_a_client_reattaches_to_a_namespace_removed_and_created_again(
    namespace: str, caplog: pytest.LogCaptureFixture
) -> None:
    first = FakeController(namespace)
    clock = FakeClock()
    client = gs.connect(namespace, clock=clock, background=False, register_timeout=0)
    second = None
    try:
        prof = client.profile("decode", DECODE)
        wait_until(lambda: prof.registered, lambda: (first.serve(), client._tick()))
        old = client.registry.segment.inode
        _remove_ipc(namespace)
        first.registry.close()
        second = FakeController(namespace)  # the restarted controller creates it anew
        caplog.set_level(logging.WARNING, "gearshift")
        clock.advance(client.heartbeat_interval)
        client._tick()  # its heartbeat finds the control segment replaced
        assert "control segment was removed or replaced" in caplog.text
        assert client.registry is not None and client.registry.segment.inode != old
        assert second.registry.slots()[client.slot].state == SlotState.ACTIVE
        wait_until(lambda: prof.registered, lambda: (second.serve(), client._tick()))
        assert second.registered[-1][2] == "decode"  # registered again with the new one
        prof.route(BATCHSIZE=1, SEQLEN=1)
        assert len(second.drain(client.slot)) == 1  # recorded into the new namespace
    finally:
        client.close()
        if second is not None:
            second.close()
        _remove_ipc(namespace)


def test_a_client_whose_slot_was_reclaimed_claims_another(namespace: str) -> None:
    fake = FakeController(namespace)
    clock = FakeClock()
    client = gs.connect(namespace, clock=clock, background=False, register_timeout=0)
    try:
        prof = client.profile("decode", DECODE)
        wait_until(lambda: prof.registered, lambda: (fake.serve(), client._tick()))
        slot, registry = client.slot, fake.registry
        generation = registry.slots()[slot].generation
        # judged dead (a stop past its lease): its ring drained and unlinked, its slot freed
        words = registry.segment.words
        words[(control.TABLE + slot * registry._slot_size + control.STATE) // 8] = SlotState.FREE
        segment.unlink(names.ring(namespace, slot))
        clock.advance(client.heartbeat_interval)
        client._tick()
        info = registry.slots()[client.slot]
        assert info.state == SlotState.ACTIVE and info.generation == generation + 1
        assert client.registry.holds(client.slot)
        wait_until(lambda: prof.registered, lambda: (fake.serve(), client._tick()))
        prof.route(BATCHSIZE=1, SEQLEN=1)
        assert len(fake.drain(client.slot)) == 1
    finally:
        client.close()
        fake.close()
        _remove_ipc(namespace)


def test_a_client_finding_every_slot_held_serves_unrecorded_and_claims_one_when_freed(
    namespace: str,
) -> None:
    """gs.connect() raised NamespaceBusy when the slots were full."""
    fake = FakeController(namespace)
    holders = [Registry.attach(namespace) for _ in range(fake.registry.nslots)]
    clock = FakeClock()
    try:
        slots = [h.claim_slot(0) for h in holders]
        client = gs.connect(namespace, clock=clock, background=False, register_timeout=0)
        try:
            prof = client.profile("decode", DECODE)
            assert client.slot is None
            prof.route(BATCHSIZE=1, SEQLEN=1)
            assert client.unrecorded == 1
            holders[0].release_slot(slots[0])  # released, ring-less: reusable at once
            clock.advance(1.0)
            client._tick()
            assert client.slot == slots[0]
        finally:
            client.close()
    finally:
        for h in holders:
            h.close()
        fake.close()
        _remove_ipc(namespace)
