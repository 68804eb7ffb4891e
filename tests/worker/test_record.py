"""Record-only mode: `profile.record(**sizes)` feeds the controller the raw shapes of a worker
that runs an engine's own graphs, with route()'s checks and none of its routing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from controller.test_processes import FAST
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import gearshift as gs
from gearshift.controller import status
from gearshift.export import engines
from gearshift.shm import Kind, Registry
from gearshift.worker import Client, Profile
from worker.fake_controller import FakeController

WAIT = 20.0
DIMS = {
    "BATCHSIZE": gs.Dim(gears=[1, 2, 4, 8, 16, 32, 64], max=256),
    "SEQLEN": gs.Dim(min=1, max=8192, align=16),
}


@pytest.fixture
def prof(client: Client) -> Profile:
    return client.profile("decode", DIMS)


def test_record_writes_the_raw_shape_with_no_gear_and_no_route(
    fake: FakeController, client: Client, prof: Profile
) -> None:
    fake.drain(client.slot)
    assert prof.record(BATCHSIZE=13, SEQLEN=700) is None
    assert prof.record(BATCHSIZE=200, SEQLEN=8192) is None  # over the largest gear: no split
    prof.record(BATCHSIZE=5, SEQLEN=3)
    events = fake.drain(client.slot)
    assert events["values"][:, :2].tolist() == [[13, 700], [200, 8192], [5, 3]]
    assert set(events["kind"]) == {Kind.RECORDED}  # only recorded: no gearshift graph ran
    assert events["chunks"].tolist() == [[0, 0, 0, 0]] * 3
    assert events["version"].tolist() == [prof.version] * 3
    assert set(events["profile"]) == {prof.id} and set(events["ndim"]) == {2}
    assert events["t_ns"][0] == client.clock.now_ns()


@pytest.mark.parametrize(
    "sizes, message",
    [
        ({"BATCHSIZE": 0, "SEQLEN": 1}, r"decode: BATCHSIZE=0 is outside \[1, 256\]"),
        ({"BATCHSIZE": 257, "SEQLEN": 1}, r"BATCHSIZE=257 is outside \[1, 256\]"),
        ({"BATCHSIZE": 1, "SEQLEN": 8193}, r"SEQLEN=8193 is outside \[1, 8192\]"),
        ({"BATCHSIZE": 1, "SEQLEN": 1, "HEADS": 2}, r"unknown \['HEADS'\], missing \[\]"),
        ({"BATCHSIZE": 1}, r"unknown \[\], missing \['SEQLEN'\]"),
        ({"BATCHSIZE": 2.0, "SEQLEN": 1}, r"BATCHSIZE=2.0: expected an int"),
        ({"BATCHSIZE": True, "SEQLEN": 1}, r"BATCHSIZE=True: expected an int"),
    ],
)
def test_bad_shapes_raise_as_route_does_and_record_nothing(
    fake: FakeController, client: Client, prof: Profile, sizes: dict, message: str
) -> None:
    fake.drain(client.slot)
    for record in (prof.record, lambda **s: Profile.record(prof, **s)):
        with pytest.raises(gs.ShapeError, match=message):
            record(**sizes)
        with pytest.raises(gs.ShapeError, match=message):
            prof.route(**sizes)
    assert len(fake.drain(client.slot)) == 0


_size = st.one_of(st.integers(-2, 300), st.booleans(), st.floats(0, 300), st.none())


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sizes=st.dictionaries(st.sampled_from(["B", "S", "X"]), _size, max_size=3))
def test_record_records_valid_sizes_and_refuses_others_recording_nothing(
    fake: FakeController, client: Client, sizes: dict
) -> None:
    dims = {"B": gs.Dim(max=256), "S": gs.Dim(min=2, max=100)}
    prof = client.profile("small", dims)
    try:
        prof.record(**sizes)
        result = "ok"
    except gs.ShapeError:
        result = "refused"
    events = fake.drain(client.slot)
    valid = set(sizes) == set(dims) and all(
        type(sizes[d]) is int and dims[d].min <= sizes[d] <= dims[d].max for d in dims
    )
    assert result == ("ok" if valid else "refused")
    recorded = [[sizes["B"], sizes["S"], 0, 0]] if valid else []
    assert events["values"].tolist() == recorded
    assert events["kind"].tolist() == [Kind.RECORDED] * len(recorded)


def test_dims_named_unlike_parameters_record(fake: FakeController, client: Client) -> None:
    prof = client.profile("odd", {"seq-len": gs.Dim(max=64), "class": gs.Dim()})
    fake.drain(client.slot)
    prof.record(**{"seq-len": 33, "class": 5})
    with pytest.raises(gs.ShapeError, match="outside"):
        prof.record(**{"seq-len": 65, "class": 5})
    assert fake.drain(client.slot)["values"][:, :2].tolist() == [[33, 5]]


def test_a_full_ring_drops_records_and_recording_goes_on(fake: FakeController) -> None:
    registry = Registry.attach(fake.namespace)
    with Client(registry, 0, background=False, register_timeout=0, ring_capacity=4) as client:
        prof = client.profile("decode", DIMS)
        for b in range(1, 7):
            prof.record(BATCHSIZE=b, SEQLEN=3)  # never raises, never blocks
        client._tick()
        assert fake.registry.slots()[client.slot].dropped == 2
        assert [e["values"][0] for e in fake.drain(client.slot)] == [1, 2, 3, 4]


def record_only(namespace: str, seconds: float, results, stop) -> None:
    """A worker process that only records: decode steps of 24 and 40 sequences (its initial
    gears: the powers of two up to 256), until `stop` or `seconds`; reports ("started",
    slot), then ("done", records, its gears in use, which it never routes on)."""
    with gs.connect(namespace) as client:
        prof = client.profile("decode", {"BATCHSIZE": gs.Dim(max=256)})
        results.put(("started", client.slot))
        deadline, records = time.monotonic() + min(seconds, WAIT), 0
        while not stop.is_set() and time.monotonic() < deadline:
            prof.record(BATCHSIZE=(24, 40)[records % 2])
            records += 1
            time.sleep(0.0005)
        results.put(("done", records, prof.gears))


def test_the_controller_learns_the_gears_of_a_worker_that_only_records(
    namespace: str, mp, spawn, tmp_path: Path
) -> None:
    command = [sys.executable, "-m", "gearshift", "serve", "-n", namespace, "--state-dir",
               str(tmp_path), "--log-level", "WARNING", *FAST]
    controller = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        results, stop = mp.Queue(), mp.Event()
        child = spawn(record_only, namespace, WAIT, results, stop)
        kind, slot = results.get(timeout=WAIT)
        assert kind == "started" and slot is not None
        deadline = time.monotonic() + WAIT
        while (dim := _dim(namespace)) is None or not {24, 40} <= set(dim["gears"]):
            assert time.monotonic() < deadline, f"no gears at the recorded sizes: {dim}"
            time.sleep(0.05)
        assert dim["samples"] > 0
        stop.set()
        kind, records, _ = results.get(timeout=WAIT)
        assert kind == "done" and records > 0
        child.join(WAIT)
        assert child.exitcode == 0
        export = subprocess.run(
            [sys.executable, "-m", "gearshift", "export", "-n", namespace, "--format", "sglang"],
            capture_output=True, text=True, timeout=WAIT, check=True,
        )
        [learned] = engines.parse(export.stdout)[0]["decode"].values()  # what serve reads
        assert {24, 40} <= set(learned)
        assert f"cuda-graph-bs-decode: [{', '.join(map(str, learned))}]" in export.stdout
    finally:
        controller.send_signal(signal.SIGTERM)
        _, err = controller.communicate(timeout=WAIT)
    assert controller.returncode == 0, err
    assert not [n for n in os.listdir("/dev/shm") if namespace in n]  # no worker: all removed


def _dim(namespace: str) -> dict | None:
    """The status document's BATCHSIZE of profile decode on device 0, once published."""
    doc = status.read(namespace) or {"devices": []}
    for device in doc["devices"]:
        for profile in device["profiles"]:
            if profile["name"] == "decode":
                return profile["dims"][0]
    return None
