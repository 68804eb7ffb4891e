"""Child bodies of the stream-ledger tests (importable by multiprocessing's forkserver)."""

from __future__ import annotations

from multiprocessing.synchronize import Event

import torch

from gearshift.shm.streams import StreamLedger
from shm.procs import WAIT


def hold(namespace: str, budget: int, n: int, held: Event, go: Event) -> None:
    """Take `n` streams of device 0's ledger, say so, and exit without giving them back."""
    ledger = StreamLedger.open(namespace, 0, budget)
    assert ledger.take(n) is None
    held.set()
    go.wait(WAIT)
    ledger.close()


def capture(
    namespace: str, budget: int, held: Event, go: Event, released: Event, leave: Event
) -> None:
    """Hold two graphs of 3 streams on a fake npu; on `go`, release one and say so; on
    `leave`, exit holding the other."""
    from graphs.fake_device import FakeCuda

    fake = FakeCuda()
    ledger = StreamLedger.open(namespace, 0, budget)
    backend = fake.backend(kind="npu", streams=ledger, streams_per_graph=3)
    x = torch.ones(2)
    graphs = [backend.graph(lambda: fake.op(lambda a: a * 2, x)) for _ in range(2)]
    for graph in graphs:
        graph.capture()
    held.set()
    go.wait(WAIT)
    graphs[0].reset()
    released.set()
    leave.wait(WAIT)
    ledger.close()
