"""A voided capture on the fake device (tests/graphs/fake_device.py): what each torch leaves in
the device and pinned-host allocators (`void`), and that the backend ends it cleanly in each."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import torch

from gearshift.graphs import device
from graphs.fake_device import FakeCuda
from graphs.fake_parts import VOIDS

W = torch.randn(64, 64)


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    yield
    device._STUCK.clear()
    device._KEPT.clear()


def body(fake: FakeCuda, x: torch.Tensor) -> torch.Tensor:
    return fake.op(lambda a: torch.tanh(a @ W), x)


def voided(fake: FakeCuda) -> object:
    """A raw graph whose capture a device-wide synchronize voided, after its failed end."""
    graph = fake.CUDAGraph()
    with fake.stream(fake.Stream()):
        graph.capture_begin()
        with pytest.raises(RuntimeError, match="not permitted"):
            fake.synchronize()
        with pytest.raises(RuntimeError, match="Invalidated"):
            graph.capture_end()
    return graph


@pytest.mark.parametrize("void", VOIDS)
def test_what_each_torch_leaves_recording_after_a_voided_capture(void: str) -> None:
    fake = FakeCuda(void=void)
    graph = voided(fake)
    pool = graph.pool_id
    ends = void != "raise"  # pytorch PR #180395: both ends come before the error check
    assert (fake.recording[0] == []) is ends
    assert (fake.host.recording == []) is ends
    graph.reset()  # unwind (#190348): and the pools of an abandoned capture are released
    assert (pool in fake.freeable[0] and pool in fake.host.freeable) is (void == "unwind")
    fake.pinned(64)
    assert fake.host.filtered == (not ends)  # a stale entry: every pinned allocation filters
    del graph
    gc.collect()
    if ends:
        fake.pinned(64)
    else:  # the entry's filter reads the CUDAGraph: gone, it is a use after free
        with pytest.raises(RuntimeError, match="use after free"):
            fake.pinned(64)


@pytest.mark.parametrize("void", VOIDS)
def test_a_voided_capture_ends_cleanly_whatever_the_torch(void: str) -> None:
    fake = FakeCuda(void=void)
    backend, x = fake.backend(), torch.randn(2, 64)
    n = []

    def syncs() -> torch.Tensor:
        n.append(1)
        if len(n) == 3:  # the recorded run
            fake.synchronize()
        return body(fake, x)

    graph = backend.graph(syncs)
    with pytest.raises(RuntimeError, match="not permitted"):
        graph.capture()
    del graph, syncs
    gc.collect()
    fake.pinned(64)  # the request path's pinned copies keep working
    assert not fake.recording[0] and backend.collect()
    assert not fake.graph_pools()  # the device pool came back, whoever released it
    # torch before #180395 cannot end the host pool: its graph is kept, reset, for the process
    assert backend.stats["host_pools_left"] == len(device._KEPT) == (void == "raise")
    # with #190348 torch's reset released the pool already; the hook's second release
    # trips the allocator's `uc >= 0` assert (suppressed; the pool is freeable either way)
    assert fake.calls["internal_assert"] == (void == "unwind")
    again = backend.graph(lambda: body(fake, x))
    again.capture()
    again.replay()
    assert backend.stats["captures"] == 1
