"""The compile backend on a device (the fake cuda and npu of tests/graphs/fake_device.py):
compile, then capture. A variant's function is compiled first, on the caller's stream and
outside any capture; the device backend then warms the compiled function up on its own stream
and records its replay into a device graph of its own pool, inside the capture window
(`device.GUARD`), as any variant's graph. Dynamo's `eager` backend (cheap): the fake's kernel
is a custom op, one node in Dynamo's graph that runs the fake's kernel when called."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import gearshift as gs
from gearshift.errors import ConfigError
from gearshift.graphs import Transform
from gearshift.graphs import device as device_module
from gearshift.graphs.backends import CpuBackend
from gearshift.graphs.pool import GraphResourcePool
from gearshift.graphs.torchcompile import CompiledRunner
from graphs.fake_device import FakeCuda

H = 4
torch.manual_seed(0)
WEIGHT = torch.randn(H, H)
SEEN: list[dict[str, Any]] = []  # each call of the kernel: where it ran
DEVICE: dict[str, FakeCuda] = {}  # the fake the kernel runs on (the test's)


@torch.library.custom_op("gearshift_test::fake_tanh_mm", mutates_args=())
def fake_tanh_mm(x: torch.Tensor) -> torch.Tensor:
    """`tanh(x @ WEIGHT)` as one kernel of the fake device: allocated on the current stream
    (from a capture's pool while one records there, which records it)."""
    fake = DEVICE["fake"]
    capture = fake.capturing_here()
    SEEN.append({"stream": fake.current_stream(), "capturing": capture is not None,
                 "window": device_module.GUARD._capturing})
    return fake.op(lambda a: torch.tanh(a @ WEIGHT), x)


@fake_tanh_mm.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty((*x.shape[:-1], H), dtype=x.dtype)


@torch.library.custom_op("gearshift_test::fake_add", mutates_args=())
def fake_add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a + b` as one kernel of the fake device."""
    return DEVICE["fake"].op(torch.add, a, b)


@fake_add.register_fake
def _(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(a)


def block(x: torch.Tensor) -> torch.Tensor:
    """Two kernels (the fake records only its own: every op of `fn` is one of them)."""
    return fake_add(fake_tanh_mm(x), x)


def reference(x: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ WEIGHT) + x


@pytest.fixture(params=["cuda", "npu"])
def fake(request: pytest.FixtureRequest) -> Iterator[tuple[FakeCuda, Any]]:
    fake = DEVICE["fake"] = FakeCuda()
    SEEN.clear()
    yield fake, fake.backend(kind=request.param)
    DEVICE.clear()
    device_module._STUCK.clear()


def make(backend: Any, **options: Any) -> CompiledRunner:
    dims = {"SEQLEN": gs.Dim(gears=[4, 16], max=64, splittable=True)}
    transform = Transform(block, dims, inputs={"x": ("S", None)}, outputs=("S", None))
    options.setdefault("compile_backend", "eager")
    return CompiledRunner(transform, {"x": torch.zeros(1, H)}, pool=GraphResourcePool(backend),
                          **options)


def test_a_compiled_variant_is_captured_as_a_device_graph_through_the_capture_window(
    fake: tuple[FakeCuda, Any],
) -> None:
    device, backend = fake
    runner = make(backend)
    SEEN.clear()  # the transform's own eager probes
    assert runner.capture([{"SEQLEN": 16}]) == 1
    assert runner.stats["compiles"] == 1 and runner.compiles[0].fullgraph
    assert backend.stats["captures"] == 1 and backend.stats["capture_failures"] == 0
    compile_run, again, *warmups, recorded = SEEN[: 3 + backend.warmup]
    # the padding probe after it: eager on the default stream
    assert all(s["stream"] is device.default_streams[0] and not s["capturing"]
               for s in SEEN[3 + backend.warmup :])
    # compiled first: a call on the caller's (default) stream, no capture, no window, and
    # once more (a second Dynamo entry would mean fn changes Python state it reads)
    for run in (compile_run, again):
        assert run["stream"] is device.default_streams[0]
        assert not run["capturing"] and not run["window"]
    # then the compiled function, warmed up on the backend's warm-up stream outside the window ...
    assert len(warmups) == backend.warmup
    assert all(w["stream"] is backend.warm_stream and not (w["capturing"] or w["window"])
               for w in warmups)
    # ... and recorded on the backend's stream inside it, into the graph's own pool
    assert recorded["stream"] is backend.stream and recorded["capturing"] and recorded["window"]
    graph = runner._variants[(16,)].graph
    assert graph.graph.tape and device.pool_bytes(graph.graph.pool()) > 0
    SEEN.clear()
    for n in (3, 16):  # a replay runs the recorded kernel, not the compiled function
        x = torch.randn(n, H)
        torch.testing.assert_close(runner.run({"x": x}), reference(x))
    assert SEEN == [] and runner.stats["eager"] == 0 and runner.stats["replays"] == 2


def test_a_released_compiled_gear_gives_its_graph_and_compiled_code_back(
    fake: tuple[FakeCuda, Any],
) -> None:
    device, backend = fake
    runner = make(backend)
    assert runner.capture([{"SEQLEN": 16}, {"SEQLEN": 4}]) == 2
    pool = runner._variants[(4,)].graph.graph.pool()
    assert device.pool_bytes(pool) > 0
    assert runner.release("SEQLEN", 4) == 1
    gc.collect()
    assert runner.compiled((4,)) is None and runner.compiled((16,)) is not None
    assert device.pool_bytes(pool) == 0 and backend.stats["collects"] >= 1
    x = torch.randn(3, H)  # now on the gear of 16
    torch.testing.assert_close(runner.run({"x": x}), reference(x))


@pytest.mark.parametrize(("key", "options"), [
    ("mode", {"compile_backend": "inductor", "mode": "reduce-overhead"}),
    ("mode", {"compile_backend": "inductor", "mode": "max-autotune"}),
    ("options", {"compile_backend": "inductor", "options": {"triton.cudagraphs": True}}),
    ("compile_backend", {"compile_backend": "cudagraphs"}),
])
def test_options_that_capture_device_graphs_of_their_own_are_refused_on_a_device(
    fake: tuple[FakeCuda, Any], key: str, options: dict[str, Any],
) -> None:
    with pytest.raises(ConfigError, match="gearshift captures each compiled gear itself") as e:
        make(fake[1], **options)
    assert e.value.key == key


def test_on_the_cpu_those_modes_are_inductor_s_own_affair() -> None:
    """No device graph to nest in: the cpu takes every mode (nothing is compiled here; the
    transform's probes run the kernel eagerly, on a fake device's default stream)."""
    DEVICE["fake"] = FakeCuda()
    try:
        runner = make(CpuBackend(), compile_backend="inductor", mode="reduce-overhead")
    finally:
        DEVICE.clear()
    assert runner.stats["compiles"] == 0
