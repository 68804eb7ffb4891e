"""Priced plan mode: the payback rule (by hand on small histograms), the bytes headroom, the
device's budget in a decision round, and the window's span (`Histogram.since`)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from gearshift.core.config import PolicyConfig
from gearshift.core.costs import Curve, Line, Prices
from gearshift.core.dims import Dim
from gearshift.core.gears import Decision, DimGears
from gearshift.core.payback import Payback, net_worth, strict
from gearshift.core.policy import decide
from gearshift.core.round import DeviceLedger, ProfileLedger, decide_round
from gearshift.core.stats import DimStats, Histogram

# The rules one by one, on a handful of events: the evidence gate (min_window_events) is off.
CFG = PolicyConfig(recent_use_protect_seconds=60.0, add_min_samples=2, min_window_events=1)
NOW = 1000.0
OLD = NOW - 250.0  # inside the window, long past the protection
LAM = math.log(2) / CFG.half_life_seconds
# The window's events all lie in OLD's slice, so its span is 250 s: a unit of decayed work
# is worth this many device seconds over the payback horizon (the rate R_w·λ / (1 - e^-λ·span)
# over R_w, times the horizon).
PER = CFG.plan_payback_seconds * LAM / -math.expm1(-LAM * 250.0)
W5 = 5 * math.exp(-LAM * 250.0)  # the decayed weight of five events at OLD
FREE = Line()


def stats(events: list[tuple[float, int]], config: PolicyConfig = CFG) -> DimStats:
    s = DimStats(config)
    s.fold(np.array([t for t, _ in events], float), np.array([v for _, v in events]))
    return s


def run(gears: tuple[int, ...], events: list[tuple[float, int]], prices: Prices | None,
        memory: float | None = None, config: PolicyConfig = CFG,
        dim: Dim | None = None) -> Decision:
    """One plan round on dim "B" (gears created long ago), priced by `prices` (None: not)."""
    dim = dim or Dim(gears=gears, max=100_000)
    state = DimGears(gears, dict.fromkeys(gears, 0.0))
    return decide({"B": dim}, {"B": state}, {"B": stats(events, config).view(NOW)}, memory, NOW,
                  config, None, None if prices is None else {"B": prices})


def at(t: float, value: int, times: int = 1) -> list[tuple[float, int]]:
    return [(t, value)] * times


def actions(d: Decision) -> list[tuple[str, int]]:
    return [(c.action, c.gear) for c in d.changes]


# On (1024,): 500 saves 524 per event of its five, 900 then 124 per event of its five.
TWO = at(OLD, 500, 5) + at(OLD, 900, 5)
SAVES_500 = 524 * W5 * PER  # device seconds (the default cost read as seconds)
SAVES_900 = 124 * W5 * PER


def test_the_hand_computed_payback_matches_the_rule() -> None:
    hist = stats(TWO).view(NOW)
    pay = Payback(Prices(Line(3.0), workers=2), hist, Dim().work, 1400 * W5, NOW, CFG)
    assert float(pay.seconds(524 * W5)) == pytest.approx(SAVES_500)
    assert pay.capture([500, 900]).tolist() == [6.0, 6.0]  # on each of the two workers


def test_a_steady_stream_is_worth_its_rate_times_the_horizon() -> None:
    # one event of 500 a second for 1000 s: 500 device seconds a second, whatever the decay
    s = stats([(float(t), 500) for t in range(1000)])
    hist = s.view(NOW)
    raw = float((hist.weights * hist.values).sum())
    pay = Payback(Prices(FREE), hist, Dim().work, raw, NOW, CFG)
    assert float(pay.seconds(raw)) == pytest.approx(500 * CFG.plan_payback_seconds, rel=0.02)
    assert float(pay.seconds(raw / 10)) == pytest.approx(50 * CFG.plan_payback_seconds,
                                                         rel=0.02)


@pytest.mark.parametrize(("since", "span"), [
    (-math.inf, CFG.window_seconds + CFG.slice_seconds),  # unknown: the whole window
    (NOW - 5.0, CFG.slice_seconds),  # at least one slice
    (NOW - 250.0, 250.0),
])
def test_the_span_is_the_windows_start_clipped_to_a_slice_and_the_window(
        since: float, span: float) -> None:
    hist = Histogram(np.array([100]), np.array([2.0]), np.array([2]), np.array([NOW]), since)
    pay = Payback(Prices(FREE), hist, Dim().work, 200.0, NOW, CFG)
    assert pay.per == pytest.approx(CFG.plan_payback_seconds * LAM / -math.expm1(-LAM * span))


@pytest.mark.parametrize(("capture", "added"), [
    (0.0, [500, 900]),
    (SAVES_900 * 0.999, [500, 900]),
    (SAVES_900 * 1.001, [500]),  # 900 no longer pays its capture back
    (SAVES_500 * 0.999, [500]),
    (SAVES_500 * 1.001, []),  # nothing pays back: no addition
    (1e9, []),
])
def test_a_gear_is_added_only_when_its_saving_exceeds_its_capture(
        capture: float, added: list[int]) -> None:
    d = run((1024,), TWO, Prices(Line(capture)))
    assert actions(d) == [("add", g) for g in added]
    assert d.gears["B"].gears == (*added, 1024)


def test_the_capture_counts_every_worker_and_grows_with_the_gear() -> None:
    # a capture of B·gear on each worker: on 4 workers 900's captures just exceed its saving
    # (500's do not), on 3 they pay back
    b = SAVES_900 / 4 / 900 * 1.01
    assert actions(run((1024,), TWO, Prices(Line(0.0, b), workers=4))) == [("add", 500)]
    assert actions(run((1024,), TWO, Prices(Line(0.0, b), workers=3))) == [("add", 500),
                                                                           ("add", 900)]


def test_the_reasons_state_the_seconds_saved_and_captured() -> None:
    d = run((1024,), TWO, Prices(Line(1000.0)))
    first, second = (c.reason for c in d.changes)
    assert first.endswith(f"padding down 37.43 pts, saves {SAVES_500:.3g} s over 1800 s for "
                          f"1e+03 s of capture")
    assert second.endswith(f"saves {SAVES_900:.3g} s over 1800 s for 1e+03 s of capture")
    assert first.startswith(f"plan of 3 gears (one more saves 8.86% >= 0.20% of the work, "
                            f"{SAVES_900:.3g} s over 1800 s)")


def test_unpriced_stops_at_plan_gear_gain_where_a_free_capture_still_pays() -> None:
    events = at(OLD, 1000, 20) + at(OLD, 900)  # 900 saves 100 of 20,900: 0.48 % < 3.5 %
    assert run((1000,), events, None).changes == ()
    d = run((1000,), events, Prices(FREE))
    assert actions(d) == [("add", 900)] and "0.48% >= 0.20% of the work" in d.changes[0].reason
    # below plan_move_gain even a free gear is not worth a move
    tiny = at(OLD, 1000, 200) + at(OLD, 990)  # saves 10 of 200,990: 0.005 %
    assert run((1000,), tiny, Prices(FREE)).changes == ()


def test_priced_the_measured_curve_replaces_the_dims_cost() -> None:
    # flat up to 900: padding 500 up to 900 costs nothing, 900 up to 1024 does
    curve = Curve((1, 900, 1024), (1.0, 1.0, 2.0))
    one = dataclasses.replace(CFG, max_gears_per_type=2)
    assert actions(run((1024,), TWO, None, config=one)) == [("add", 500)]
    assert actions(run((1024,), TWO, Prices(FREE, replay=curve), config=one)) == [("add", 900)]


def test_priced_an_unused_gear_is_kept_unless_under_pressure() -> None:
    events = at(OLD, 1024, 10)
    assert actions(run((100, 1024), events, None)) == [("evict", 100)]  # below all traffic
    assert run((100, 1024), events, Prices(FREE)).changes == ()  # held costs only its bytes
    assert actions(run((100, 1024), events, Prices(FREE), memory=0.95)) == [("evict", 100)]


@pytest.mark.parametrize(("headroom", "added"), [
    (None, [500, 900]), (1500.0, [500, 900]), (1400.0, [500, 900]), (1399.0, [500]),
    (600.0, [500]), (500.0, [500]), (499.0, []),  # a graph of exactly the headroom fits
])
def test_a_graph_that_does_not_fit_the_headroom_is_not_added(
        headroom: float | None, added: list[int]) -> None:
    prices = Prices(FREE, bytes=Line(0.0, 1.0), headroom=headroom)  # a gear's bytes: its size
    assert actions(run((1024,), TWO, prices)) == [("add", g) for g in added]


@pytest.mark.parametrize(("headroom", "swapped"), [(450.0, True), (400.0, True),
                                                   (399.0, False), (350.0, False)])
def test_a_swap_counts_the_bytes_its_eviction_frees(headroom: float, swapped: bool) -> None:
    # 100 serves nothing; 500 needs 500 bytes, 100 frees 100
    prices = Prices(FREE, bytes=Line(0.0, 1.0), headroom=headroom)
    d = run((100, 1024), at(OLD, 500, 10), prices)
    assert actions(d) == ([("evict", 100), ("add", 500)] if swapped else [])


def test_a_negative_headroom_is_pressure() -> None:
    events = at(OLD, 90, 10) + at(OLD, 190, 2) + at(OLD, 290, 10) + at(OLD, 700, 10)
    gears = (100, 200, 300, 1000)
    held = Line(0.0, 1.0)  # a graph's bytes: its gear
    calm = run(gears, events, Prices(FREE, bytes=held, headroom=1e12))
    assert len(calm.gears["B"].gears) > len(gears)
    over = run(gears, events, Prices(FREE, bytes=held, headroom=-1.0))
    assert ("evict", 200) in actions(over) and len(over.gears["B"].gears) == len(gears) - 1
    pressed = run(gears, events, Prices(FREE, bytes=held), memory=0.95)
    assert actions(over) == actions(pressed)  # as a memory reading over the threshold


def test_rules_mode_and_an_empty_price_list_ignore_prices() -> None:
    rules = dataclasses.replace(CFG, policy_mode="rules")
    events = TWO + at(OLD, 300, 5)
    assert run((1024,), events, Prices(Line(1e9)), config=rules).changes == run(
        (1024,), events, None, config=rules).changes
    state = {"B": DimGears((1024,), {1024: 0.0})}
    hist = {"B": stats(TWO).view(NOW)}
    dims = {"B": Dim(gears=(1024,), max=100_000)}
    assert decide(dims, state, hist, None, NOW, CFG, prices={}) == decide(
        dims, state, hist, None, NOW, CFG)


def test_a_graph_of_exactly_the_headroom_fits_alone_or_with_what_its_swap_frees() -> None:
    hist = stats(TWO).view(NOW)
    pay = Payback(Prices(FREE, bytes=Line(0.0, 1.0), headroom=500.0), hist, Dim().work,
                  1400 * W5, NOW, CFG)
    assert pay.fits(500) and not pay.fits(501)
    a = np.array([500, 501])
    net = net_worth(np.array([1e3, 1e3]), a, 1.0, pay)
    assert np.isfinite(net[0]) and net[1] == -np.inf
    swapped = net_worth(np.array([[1e3, 1e3]]), a + 100, 1.0, pay, evicted=np.array([100]))
    assert np.isfinite(swapped[0, 0]) and swapped[0, 1] == -np.inf
    unbounded = Payback(Prices(FREE, bytes=Line(0.0, 1.0)), hist, Dim().work, 1400 * W5, NOW,
                        CFG)
    assert unbounded.fits(10**9)


def test_taking_and_giving_a_graph_moves_the_headroom_by_its_bytes() -> None:
    hist = stats(TWO).view(NOW)
    pay = Payback(Prices(FREE, bytes=Line(0.0, 1.0), headroom=1000.0, workers=2), hist,
                  Dim().work, 1400 * W5, NOW, CFG)
    pay.take(300)
    assert pay.headroom == 400.0  # 300 bytes on each of two workers
    pay.give(100)
    assert pay.headroom == 600.0
    unbounded = Payback(Prices(FREE), hist, Dim().work, 1400 * W5, NOW, CFG)
    unbounded.take(300)
    assert unbounded.headroom is None


def test_net_worth_priced_refuses_a_saving_under_the_least_however_cheap() -> None:
    pay = Payback(Prices(FREE), stats(TWO).view(NOW), Dim().work, 1400 * W5, NOW, CFG)
    net = net_worth(np.array([5.0, 1.0]), np.array([10, 20]), 2.0, pay)
    assert net[0] == pytest.approx(float(pay.seconds(5.0))) and net[1] == -np.inf


def test_net_worth_unpriced_is_the_saving_over_the_least() -> None:
    a = np.array([10, 20, 30])
    net = net_worth(np.array([5.0, 2.0, 1.0]), a, 2.0, None)
    assert net[0] == 3.0 and 0 < net[1] < 1e-200 and net[2] == -np.inf


def test_strict_makes_a_flat_cost_increasing_by_a_billionth() -> None:
    flat = strict(Curve((1, 100), (2.0, 2.0)), 100)
    y = flat(np.array([1, 50, 100]))
    assert (np.diff(y) > 0).all() and y[-1] == pytest.approx(2.0, rel=2e-9)


def test_priced_a_gear_held_is_not_dropped_for_saving_little() -> None:
    events = at(OLD, 100, 10) + at(OLD, 190) + at(OLD, 300, 10) + at(OLD, 1000, 10)
    config = dataclasses.replace(CFG, plan_gear_keep=0.05, plan_gear_gain=0.5)
    assert actions(run((100, 200, 300, 1000), events, None, config=config)) == [("evict", 200)]
    assert run((100, 200, 300, 1000), events, Prices(Line(1e6)), config=config).changes == ()


def test_a_curve_flat_at_its_low_end_plans_as_one_that_rises_there() -> None:
    # the weight that forces a protected gear in stays within the DP's precision
    values = np.random.default_rng(0).integers(600, 8000, 300)  # all above the flat part
    hist = {"B": stats([(OLD, int(v)) for v in values]).view(NOW)}
    dims = {"B": Dim(gears=(300, 8192), max=100_000)}
    state = {"B": DimGears((300, 8192), {300: NOW - 10.0, 8192: 0.0})}  # 300 is protected
    flat, rising = (Curve((0, 512, 8192), (low, 1e-3, 2e-2)) for low in (1e-3, 0.0))
    steps = [decide(dims, state, hist, None, NOW, CFG, prices={"B": Prices(FREE, replay=c)})
             for c in (flat, rising)]
    assert [(c.action, c.gear, c.reason) for c in steps[0].changes] == [
        (c.action, c.gear, c.reason) for c in steps[1].changes]


def test_a_protected_gear_on_a_flat_stretch_of_the_curve_stays_in_the_plan() -> None:
    values = [1150] * 20 + [1190] * 20 + [3000] * 5
    hist = {"B": stats([(OLD, v) for v in values]).view(NOW)}
    dims = {"B": Dim(gears=(1100, 8192), max=100_000)}
    state = {"B": DimGears((1100, 8192), {1100: NOW - 10.0, 8192: 0.0})}  # 1100 is protected
    curve = Curve((1, 1000, 1200, 8192), (1e-3, 2e-3, 2e-3, 2e-2))  # flat from 1000 to 1200
    d = decide(dims, state, hist, None, NOW, CFG, prices={"B": Prices(FREE, replay=curve)})
    assert 1100 in d.gears["B"].gears and 8192 in d.gears["B"].gears


# decide_round under a device budget: the headroom is the budget less every priced dim's bytes


def _ledger(gears: tuple[int, ...], events: list[tuple[float, int]]) -> DeviceLedger:
    dims = {"B": Dim(gears=gears, max=100_000)}
    profile = ProfileLedger.new(dims, 0.0, CFG)
    profile.stats["B"].fold(np.array([t for t, _ in events], float),
                            np.array([v for _, v in events]))
    return DeviceLedger(last_update=0.0, profiles={"p": profile})


BYTES = {"p": {"B": Prices(FREE, bytes=Line(0.0, 1.0))}}  # a graph's bytes: its gear


@pytest.mark.parametrize(("budget", "added"), [
    (None, [500, 900]), (1024 + 1400.0, [500, 900]), (1024 + 1000.0, [500]),
    (1024 + 100.0, []),
])
def test_a_round_adds_only_what_the_devices_budget_holds(
        budget: float | None, added: list[int]) -> None:
    config = dataclasses.replace(CFG, graph_memory_budget_bytes=budget,
                                 graph_memory_budget_ratio=None)  # None: unbounded
    round = decide_round(_ledger((1024,), TWO), NOW, None, config, prices=BYTES)
    assert round is not None
    assert [(c.action, c.gear) for c in round.changes["p"]] == [("add", g) for g in added]


def test_a_round_over_the_devices_budget_is_under_pressure() -> None:
    config = dataclasses.replace(CFG, graph_memory_budget_bytes=1000.0)  # 100 + 1024 held
    ledger = _ledger((100, 1024), TWO)
    round = decide_round(ledger, NOW, None, config, prices=BYTES)
    assert round is not None and [(c.action, c.gear) for c in round.changes["p"]] == [
        ("evict", 100)]
    assert round.changes["p"][0].reason.startswith("unused: below all traffic")
    free = dataclasses.replace(config, graph_memory_budget_bytes=None)
    round = decide_round(ledger, NOW, None, free, prices=BYTES)
    assert round is not None and ("add", 500) in [(c.action, c.gear) for c in round.changes["p"]]



def test_one_round_never_spends_more_than_the_devices_headroom() -> None:
    config = dataclasses.replace(CFG, graph_memory_budget_bytes=2 * 1024 + 600.0)
    dims = {"A": Dim(gears=(1024,), max=100_000), "B": Dim(gears=(1024,), max=100_000)}
    profile = ProfileLedger.new(dims, 0.0, CFG)
    for d in dims:
        profile.stats[d].fold(np.full(5, OLD), np.full(5, 500))
    ledger = DeviceLedger(last_update=0.0, profiles={"p": profile})
    prices = {"p": {d: Prices(FREE, bytes=Line(0.0, 1.0)) for d in dims}}
    round = decide_round(ledger, NOW, None, config, prices=prices)
    assert round is not None
    held = sum(sum(g.gears) for g in round.gears["p"].values())
    assert held <= 2 * 1024 + 600.0, round.changes


# Histogram.since: the start of the oldest slice still holding events of the window


def test_the_view_knows_since_when_its_window_holds_events() -> None:
    s = DimStats(CFG)  # slices of 10 s, a window of 600 s
    assert s.view(NOW).since == -math.inf  # nothing yet
    s.fold(np.array([125.0, 347.0, 351.0]), np.array([8, 8, 9]))
    assert s.view(400.0).since == 120.0
    assert s.view(725.0).since == 120.0  # slice [120, 130) still overlaps the window
    assert s.view(731.0).since == 340.0  # it has left: the next one holding events
    assert s.view(2000.0).since == -math.inf


def test_the_history_view_has_its_own_since() -> None:
    s = DimStats(CFG, DimStats(CFG.history()))  # the history's slices: 30 s
    s.fold(np.array([125.0, 347.0]), np.array([8, 9]))
    assert s.history is not None and s.history.view(400.0).since == 120.0
    assert s.history.view(1949.0).since == 120.0  # a window of 1800 s, in slices of 30 s
    assert s.history.view(1951.0).since == 330.0  # 125's slice [120, 150) has gone


def test_over_the_bound_an_addition_evicts_what_earns_least_per_byte() -> None:
    # Evicting 200 adds 2 x 800 of padding for 200 bytes (8 a byte), evicting 100 adds
    # 10 x 100 for 100 bytes (10 a byte): 200 goes, though it loses more in all.
    events = at(OLD, 100, 10) + at(OLD, 200, 2) + at(OLD, 500, 10)
    prices = Prices(FREE, bytes=Line(0.0, 1.0), headroom=420.0)
    d = run((100, 200, 1000), events, prices)
    assert actions(d) == [("evict", 200), ("add", 500)]
    assert "earns least per byte" in d.changes[0].reason
    assert actions(run((100, 200, 1000), events, dataclasses.replace(prices, headroom=None))
                   ) == [("add", 500)]
    # a trade must still pay its capture back
    dear = Prices(Line(1e9), bytes=Line(0.0, 1.0), headroom=420.0)
    assert run((100, 200, 1000), events, dear).changes == ()


def test_a_trade_evicts_as_many_as_the_addition_needs_least_per_byte_first() -> None:
    # 500 needs 500 bytes, 100 are free: 200 goes (0.5 a byte), then 300 (5 a byte, 100: 20)
    events = at(OLD, 100, 10) + at(OLD, 200) + at(OLD, 300) + at(OLD, 500, 10)
    prices = Prices(FREE, bytes=Line(0.0, 1.0), headroom=100.0)
    d = run((100, 200, 300, 1000), events, prices)
    assert actions(d) == [("evict", 200), ("evict", 300), ("add", 500)]
    assert "in for 200, 300" in d.changes[-1].reason
    # all or nothing: a trade evicts what its addition needs, more than plan_max_moves too
    # (capped, 500 could never come in under this bound, whatever the traffic)
    one = dataclasses.replace(CFG, plan_max_moves=1)
    assert actions(run((100, 200, 300, 1000), events, prices, config=one)) == actions(d)


@pytest.mark.parametrize(("times", "moved"), [(3, False), (30, True)])
def test_a_trade_at_the_plans_count_is_a_swap_scored_with_its_confidence(
        times: int, moved: bool) -> None:
    # Three gears and no room for a fourth (max_gears_per_type): the plan moves 200 to 500,
    # and 500 fits the headroom. On 3 events each the swap saves less than its standard
    # error, so nothing moves (an addition that fits was once made anyway, the plan's count
    # then evicting a gear: a swap never scored as one); on 30 it is made, as a swap.
    events = at(OLD, 100, 10 * times) + at(OLD, 200, times) + at(OLD, 500, times)
    prices = Prices(FREE, bytes=Line(0.0, 1.0), headroom=10_000.0)
    config = dataclasses.replace(CFG, max_gears_per_type=3)
    d = run((100, 200, 1000), events, prices, config=config)
    assert sorted(actions(d)) == ([("add", 500), ("evict", 200)] if moved else [])


@pytest.mark.parametrize(("used", "moved"), [(False, True), (True, False)])
def test_a_move_that_evicts_a_used_gear_also_pays_for_capturing_it_again(
        used: bool, moved: bool) -> None:
    # 500 fits once 100 is gone. With one event on 100, undoing the move would capture 100
    # again: the move must save both captures; without traffic there, only 500's.
    events = at(OLD, 500, 10) + (at(OLD, 100) if used else [])
    w = W5 / 5  # one event's decayed weight
    # the trade's saving less one standard error, in device seconds (see moves.swaps/_trade)
    saved = (4840 - math.sqrt(524**2 * 10 + 924**2)) * w * PER
    prices = Prices(Line(saved / 1.5), bytes=Line(0.0, 1.0), headroom=450.0)
    d = run((100, 1024), events, prices)
    assert sorted(actions(d)) == ([("add", 500), ("evict", 100)] if moved else [])


@pytest.mark.parametrize(("buffers", "head"), [
    (Line(), [("add", 1100), ("add", 500)]),  # unreported: the cover takes its graph alone
    (Line(0.0, 1.0), [("add", 1100), ("evict", 1024), ("add", 500)]),  # 76 bytes more
])
def test_a_cover_takes_what_it_grows_the_buffers_by_from_the_headroom(
        buffers: Line, head: list[tuple[str, int]]) -> None:
    # 1,650 bytes of room: the new largest gear 1100 leaves 550, where 500 fits, not once the
    # buffers grow by 1100 - 1024 bytes, and then only traded for 1024.
    prices = Prices(FREE, bytes=Line(0.0, 1.0), headroom=1650.0, buffers=buffers)
    assert actions(run((1024,), TWO + at(OLD, 1100, 2), prices))[:len(head)] == head


def test_a_cover_takes_its_own_graph_from_the_headroom_in_its_round() -> None:
    # 550 bytes of room: the cover's 1100 does not fit beside 1024, so the round makes room
    # (1024 goes) and adds nothing else; once the cover's graph was charged only from the
    # next round, 500 and 900 came in for 1024 and the round ended at 2,500 bytes against 1,574.
    prices = Prices(FREE, bytes=Line(0.0, 1.0), headroom=550.0)
    d = run((1024,), TWO + at(OLD, 1100, 2), prices)
    assert actions(d) == [("add", 1100), ("evict", 1024)]
    assert sum(d.gears["B"].gears) <= 1024 + 550
