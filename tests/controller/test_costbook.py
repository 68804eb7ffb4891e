"""The cost book: measurements checked field by field, kept within bounds, fitted and priced;
through a controller: from real rings into the status, the metrics' document, the state file,
and the decision rounds' prices."""

from __future__ import annotations

import numpy as np
import pytest
from fakeclock import FakeClock

from gearshift.controller import costbook, statefile
from gearshift.controller.controller import Controller
from gearshift.controller.costbook import (
    MAX_GEARS,
    MAX_TAKE,
    PER_GEAR,
    VIEW_GEARS,
    CostBook,
)
from gearshift.controller.view import render
from gearshift.core.costs import Line, Measurement
from gearshift.core.dims import Dim
from gearshift.core.round import ProfileLedger
from gearshift.shm import EVENT_DTYPE, Kind, ring

from .workers import POLICY, Worker

DIMS = {"B": Dim(gears=[1, 2, 4, 8, 16, 32, 64], max=64), "S": Dim(gears=[16, 128], max=128)}


def events_of(kind: Kind, rows: list[tuple[int, int, tuple[int, ...]]]) -> np.ndarray:
    """Ring events of `kind` from (profile id, dim index, `ring` encoder's arguments after it)."""
    encode = ring.measured if kind == Kind.MEASURED else ring.buffers
    events = np.zeros(len(rows), EVENT_DTYPE)
    for e, (profile, dim, rest) in zip(events, rows, strict=True):
        v0, v1, v2, v3, meta, counts = encode(profile, 3, dim, *rest)
        e["values"] = (v0, v1, v2, v3)
        e["kind"], e["ndim"], e["profile"], e["version"] = kind, 4, profile, 3
        e["chunks"][0] = counts
        assert meta >> 48 & 0xFF == kind
    return events


def records(*rows: tuple[int, int, int, int, float, int, float]) -> np.ndarray:
    """MEASURED records of (profile id, dim index, gear, capture s, bytes, replay s)."""
    return events_of(Kind.MEASURED, [(r[0], r[1], tuple(r[2:])) for r in rows])


def ledger() -> ProfileLedger:
    return ProfileLedger.new(DIMS, 0.0, POLICY)


def test_take_keeps_valid_records_and_counts_the_others() -> None:
    book, profile = CostBook(), ledger()
    events = records(
        (0, 0, 8, 0.5, 1 << 20, 1e-3),  # kept: B=8
        (0, 1, 128, 0.5, 1 << 20, 2e-3),  # kept: S=128
        (1, 0, 8, 0.5, 1 << 20, 1e-3),  # a profile id no registration maps: unknown
        (0, 0, 40, 0.5, 1 << 20, 1e-3),  # a gear the profile does not know: unknown
        (0, 2, 8, 0.5, 1 << 20, 1e-3),  # no third dim: invalid
        (0, 0, 100, 0.5, 1 << 20, 1e-3),  # outside B's bounds: invalid
        (0, 0, 8, 4000.0, 1 << 20, 1e-3),  # capture seconds over the bound: invalid
        (0, 0, 8, 0.5, 1 << 50, 1e-3),  # bytes over the bound: invalid
    )
    bad_ndim = records((0, 0, 8, 0.5, 1, 1e-3))
    bad_ndim["ndim"] = 1
    negative = records((0, 0, 8, 0.5, 1, 1e-3))
    negative["values"][0, 3] = -5
    samples = np.zeros(2, EVENT_DTYPE)  # not measurements: not the book's
    samples["kind"] = Kind.SHAPE
    events = np.concatenate([events, bad_ndim, negative, samples])
    keys = np.where(events["profile"] == 0, 7, -1)
    book.take(events, keys, lambda key: (0, "decode", profile) if key == 7 else (0, "?", None))
    assert book.counts == {"measured": 2, "unknown": 2, "invalid": 6}
    kept = book.measurements(0, "decode")
    assert kept == {"B": [Measurement(8, 0.5, 1 << 20, 1e-3)],
                    "S": [Measurement(128, 0.5, 1 << 20, 2e-3)]}
    book.take(records((0, 0, 8, 0.5, 1, 1e-3)), np.array([7]), lambda key: (0, "gone", None))
    assert book.counts["unknown"] == 3  # a key whose profile the device no longer has


def test_an_evicted_or_initial_gear_is_known_and_a_flood_is_cut() -> None:
    book, profile = CostBook(), ledger()
    state = profile.gears["B"]
    profile.gears["B"] = type(state)((1, 64), {1: 0.0, 64: 0.0}, evicted={40: 0.0})
    events = records((0, 0, 40, 0.1, 1, 1e-3), (0, 0, 8, 0.1, 1, 1e-3))  # evicted, initial
    book.take(events, np.zeros(2, np.int64), lambda key: (0, "decode", profile))
    assert book.counts == {"measured": 2, "unknown": 0, "invalid": 0}
    flood = records(*[(0, 0, 1, 0.1, 1, 1e-3)] * (MAX_TAKE + 10))
    book.take(flood, np.zeros(len(flood), np.int64), lambda key: (0, "decode", profile))
    assert book.counts == {"measured": 2 + MAX_TAKE, "unknown": 0, "invalid": 10}


def test_memory_is_bounded_per_gear_and_per_dim() -> None:
    book = CostBook()
    for i in range(PER_GEAR + 5):
        book.add(0, "p", "B", Measurement(8, 0.1, 1, i * 1e-3))
    assert [m.replay_seconds for m in book.measurements(0, "p")["B"]] == pytest.approx(
        [i * 1e-3 for i in range(5, PER_GEAR + 5)])  # the latest PER_GEAR
    for gear in range(1, MAX_GEARS + 11):
        book.add(0, "p", "S", Measurement(gear, 0.1, 1, 1e-3))
    book.add(0, "p", "S", Measurement(5, 0.1, 1, 1e-3))  # measured again: the most recent
    gears = [m.gear for m in book.measurements(0, "p")["S"]]
    assert len(gears) == MAX_GEARS and gears[-2:] == [MAX_GEARS + 10, 5]
    assert gears[0] == 12 and 11 not in gears  # the gears measured longest ago went
    shown = book.view(0, "p")["S"]["gears"]  # the status document shows the latest few
    assert shown == sorted([5, *range(MAX_GEARS + 11 - VIEW_GEARS + 1, MAX_GEARS + 11)])
    book.forget(0, "p")
    assert book.measurements(0, "p") == {} and book.costs(0, "p") == {}


def test_fits_are_cached_until_measured_again_and_priced_from_two_gears() -> None:
    book = CostBook()
    book.add(0, "p", "B", Measurement(8, 0.05 + 8e-3, 1000, 1e-3))
    assert book.costs(0, "p")["B"].replay is None and book.prices(0, "p", 3) == {}
    fitted = book.costs(0, "p")["B"]
    assert book.costs(0, "p")["B"] is fitted  # cached
    book.add(0, "p", "B", Measurement(64, 0.05 + 64e-3, 8000, 5e-3))
    costs = book.costs(0, "p")["B"]
    assert costs is not fitted and costs.measurements == 2
    assert costs.capture is not None and costs.capture.seconds == pytest.approx((0.058, 0.114))
    prices = book.prices(0, "p", 3)["B"]
    assert prices.workers == 3 and prices.capture_cost([8]) == pytest.approx(3 * 0.058)
    assert prices.capture_cost([36]) == pytest.approx(3 * 0.086)  # between measured gears
    view = book.view(0, "p")["B"]
    assert view["gears"] == [8, 64] and view["counts"] == [1, 1]
    assert view["replay_seconds"] == view["replay_fit"] == pytest.approx([1e-3, 5e-3])
    assert view["capture_seconds"] == view["capture_fit"] == pytest.approx([0.058, 0.114])
    assert view["graph_bytes"] == pytest.approx({"a": 0.0, "b": 125.0})


def test_from_state_checks_every_row_as_a_worker_record() -> None:
    rows = {"B": [[8, 0.5, 1024, 1e-3]]}
    assert costbook.from_state("p", DIMS, rows) == {"B": [Measurement(8, 0.5, 1024, 1e-3)]}


def _measure(w: Worker, profile: int, *rows: tuple[int, int, float, int, float]) -> None:
    for dim, gear, capture, nbytes, replay in rows:
        assert w.ring.write(1, *ring.measured(profile, 1, dim, gear, capture, nbytes, replay))


def _run(controller: Controller, clock: FakeClock, seconds: float, *workers: Worker) -> None:
    for _ in range(round(seconds * 10)):
        clock.advance(0.1)
        for w in workers:
            w.put(0, 40)
        controller.step()


def test_a_controller_keeps_shows_saves_and_restores_what_workers_measured(
    controller: Controller, worker, clock: FakeClock
) -> None:
    good, bad = worker(), worker()
    good.register(0, "decode", serve=controller.step)
    bad.register(0, "decode", serve=controller.step)
    _measure(good, 0, (0, 8, 0.2, 2 << 20, 1e-3), (0, 64, 0.3, 9 << 20, 6e-3))
    _measure(bad, 0, (0, 9, 0.2, 1, 1e-3), (3, 8, 0.2, 1, 1e-3))  # unknown gear, no dim 3
    _measure(bad, 5, (0, 8, 0.2, 1, 1e-3))  # an id it never registered
    bad.ring.put(1, 0, 1, (8, -1, 1, 1), (0,), Kind.MEASURED)  # negative seconds, 1 dim
    controller.step()
    counts = controller.counts
    assert (counts["measured"], counts["unknown"], counts["invalid"]) == (2, 2, 2)
    assert counts["errors"] == 0 and counts["folded"] == 0  # measurements are not samples
    doc = controller.status_document(clock.now())
    [dim] = doc["devices"][0]["profiles"][0]["dims"]
    assert dim["costs"]["gears"] == [8, 64] and dim["costs"]["measurements"] == 2
    assert dim["costs"]["replay_fit"] == pytest.approx([1e-3, 6e-3])
    text = render({"namespace": "n", "controller": {"pid": 1, "alive": True,
                                                    "heartbeat_age_seconds": None},
                   "slots": [], "versions": {}, "status": doc}, verbose=True)
    assert "2 measurements" in text and "measured: 2 graphs; graph 1 MiB + 128 KiB·gear" in text
    assert "replay fit      1ms     6ms" in text and "capture fit   200ms   300ms" in text
    _run(controller, clock, 6.0, good)  # saved within save_interval_seconds of a round
    controller.saver.wait()
    book = CostBook()
    statefile.load(controller.config.state_path, clock.now(), POLICY, book)
    assert book.measurements(0, "decode") == controller.costs.measurements(0, "decode")


def test_rounds_are_priced_with_the_measured_costs_and_the_device_s_workers(
    controller: Controller, worker, clock: FakeClock
) -> None:
    """The same traffic on two devices: plan mode adds a gear at 40 where nothing was measured,
    and not where a capture was measured at 3000 s (it cannot pay back in 1800 s)."""
    priced, unpriced = worker(0), worker(1)
    priced.register(0, "decode", serve=controller.step)
    unpriced.register(0, "decode", serve=controller.step)
    _measure(priced, 0, (0, 32, 3000.0, 1 << 20, 1e-3), (0, 64, 3000.0, 1 << 20, 2e-3))
    _run(controller, clock, 12.0, priced, unpriced)
    assert 40 in unpriced.gears("decode")["B"]
    assert 40 not in priced.gears("decode")["B"]
    priced_b = controller.prices(0)["decode"]["B"]  # what the device's rounds are priced with
    assert priced_b == controller.costs.prices(0, "decode", 1)["B"]
    assert priced_b.workers == 1  # device 0's one worker: the other device's is not counted
    assert controller.prices(1) == {"decode": {}}  # nothing measured there: unpriced


def buffers(*rows: tuple[int, int, int, int, int]) -> np.ndarray:
    """BUFFERS records of (profile id, dim index, gear, bytes, bytes on the dim)."""
    return events_of(Kind.BUFFERS, [(r[0], r[1], tuple(r[2:])) for r in rows])


def test_buffers_records_are_checked_and_the_last_of_each_dim_is_priced() -> None:
    book, profile = CostBook(), ledger()
    for gear in (8, 64):  # B priced: two gears measured
        book.add(0, "decode", "B", Measurement(gear, 0.1, 1000, gear * 1e-5))
    assert book.prices(0, "decode", 2)["B"].buffers == Line()  # none reported: none counted
    events = buffers(
        (0, 0, 8, 1000, 800),  # B at 8: superseded by the next
        (0, 0, 16, 1800, 1600),  # kept: 200 + 100 a row
        (0, 1, 128, 1800, 1800),  # kept: S
        (0, 0, 100, 1800, 1600),  # outside B's bounds: invalid
        (0, 0, 0, 1800, 1600),  # a gear of 0: invalid
        (0, 0, 16, 1800, 1801),  # more bytes on the dim than in all: invalid
        (0, 0, 16, -1, 0),  # negative bytes: invalid
        (0, 0, 16, 1 << 50, 0),  # over MAX_GRAPH_BYTES: invalid
        (0, 2, 16, 1800, 1600),  # no third dim: invalid
        (1, 0, 16, 1800, 1600),  # a profile id no registration maps: unknown
    )
    reserved = buffers((0, 0, 16, 1, 1))
    reserved["values"][0, 3] = 7  # the reserved value is not 0: invalid
    events = np.concatenate([events, reserved])
    keys = np.where(events["profile"] == 0, 7, -1)
    book.take(events, keys, lambda key: (0, "decode", profile))
    assert book.counts == {"measured": 0, "unknown": 1, "invalid": 7}
    assert book.buffers(0, "decode") == {"B": Line(200.0, 100.0), "S": Line(0.0, 1800 / 128)}
    priced = book.prices(0, "decode", 2)["B"]
    assert priced.buffers == Line(200.0, 100.0) and priced.buffer_bytes(16) == 2 * 1800
    book.forget(0, "decode")
    assert book.buffers(0, "decode") == {}
