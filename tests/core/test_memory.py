"""The graph memory bound: by default what the start-up gears held plus the slack, at least
the floor; the keys that set or lift it; a round under it trades gears instead of adding."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gearshift.configfile import load_policy_config
from gearshift.core.config import PolicyConfig
from gearshift.core.costs import Line, Prices
from gearshift.core.dims import Dim
from gearshift.core.memory import (
    FLOOR_GRAPHS,
    MODEL_GRAPH_BYTES,
    bound,
    device_usage,
    graph_bytes,
    held_bytes,
    start_bytes,
)
from gearshift.core.round import DeviceLedger, ProfileLedger, decide_round
from gearshift.errors import ConfigError

CFG = PolicyConfig()
LADDER = (8, 16, 32, 64, 128, 256, 512, 1024)
DIMS = {"p": {"S": Dim(gears=LADDER, max=1024)}}
COUNT = {"p": {"S": Prices(Line(), bytes=Line(1.0))}}  # a graph's bytes: 1, whatever its gear


def test_unmeasured_bytes_are_the_model_and_measured_ones_are_kept() -> None:
    assert graph_bytes(Line()) == Line(float(MODEL_GRAPH_BYTES))
    assert graph_bytes(Line(0.0, 3.0)) == Line(0.0, 3.0)
    assert graph_bytes(Line(5.0)) == Line(5.0)  # a graph of fixed bytes was measured too


def test_the_default_bound_is_the_start_up_bytes_plus_a_quarter() -> None:
    assert start_bytes(DIMS, COUNT) == 8.0
    assert bound(DIMS, COUNT, CFG) == 10.0
    two = {"p": {"S": dataclasses.replace(COUNT["p"]["S"], workers=2)}}
    assert bound(DIMS, two, CFG) == 20.0  # every worker holds every graph


def test_the_bound_is_never_below_the_floor() -> None:
    one = {"p": {"S": Dim(gears=(1024,), max=1024)}}
    assert bound(one, COUNT, CFG) == FLOOR_GRAPHS  # a profile started on one gear can grow
    per_gear = {"p": {"S": Prices(Line(), bytes=Line(0.0, 1.0))}}
    assert bound(one, per_gear, CFG) == FLOOR_GRAPHS * 1024
    # the floor is graphs of the largest start-up gear, not the smallest: 2 x 1024 over
    # 1.25 x (8 + 1024)
    two = {"p": {"S": Dim(gears=(8, 1024), max=1024)}}
    assert bound(two, per_gear, CFG) == FLOOR_GRAPHS * 1024


def test_the_keys_set_scale_or_lift_the_bound() -> None:
    assert bound(DIMS, COUNT, PolicyConfig(graph_memory_budget_bytes=3.0)) == 3.0
    assert bound(DIMS, COUNT, PolicyConfig(graph_memory_budget_ratio=2.0)) == 16.0
    assert bound(DIMS, COUNT, PolicyConfig(graph_memory_budget_ratio=None)) is None
    assert bound(DIMS, {}, CFG) is None  # nothing priced: nothing to bound
    config = load_policy_config(None, ["graph_memory_budget_ratio=none"])
    assert config.graph_memory_budget_ratio is None
    with pytest.raises(ConfigError, match="graph_memory_budget_ratio"):
        PolicyConfig(graph_memory_budget_ratio=0.0)


def test_the_bound_is_never_below_its_share_of_the_device() -> None:
    assert bound(DIMS, COUNT, CFG, device_bytes=1000.0) == 10.0  # 0.5 % of it: 5 bytes
    assert bound(DIMS, COUNT, CFG, device_bytes=4000.0) == 20.0  # 0.5 %: over the start's
    off = load_policy_config(None, ["graph_memory_floor_ratio=none"])
    assert bound(DIMS, COUNT, off, device_bytes=4000.0) == 10.0
    assert bound(DIMS, COUNT, PolicyConfig(graph_memory_floor_ratio=0.0), 4000.0) == 10.0
    explicit = PolicyConfig(graph_memory_budget_bytes=3.0)  # bytes set: the user's, as given
    assert bound(DIMS, COUNT, explicit, device_bytes=4000.0) == 3.0
    assert bound(DIMS, COUNT, PolicyConfig(graph_memory_budget_ratio=None), 4000.0) is None
    ledger = _ledger(CFG)
    ledger.memory_bytes = 4000.0
    assert device_usage(ledger, COUNT, CFG) == (8.0, 20.0, 0.0)
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ConfigError, match="graph_memory_floor_ratio"):
            PolicyConfig(graph_memory_floor_ratio=bad)


def test_a_round_grows_into_the_devices_share() -> None:
    config = PolicyConfig(min_window_events=1)
    prices = {"p": {"S": Prices(Line(), replay=None, bytes=Line(1.0))}}
    held = {}
    for device in (None, 4000.0):
        ledger = _ledger(config)
        ledger.memory_bytes = device
        assert ledger.snapshot().memory_bytes == device  # a round off the loop reads it too
        for now in np.arange(15.0, 600.0, 15.0):
            round = decide_round(ledger, float(now), None, config, prices=prices)
            if round is not None:
                ledger.apply(round)
        held[device] = len(ledger.profiles["p"].gears["S"].gears)
    assert held[None] == 10 and 10 < held[4000.0] <= 20


def test_held_bytes_counts_the_priced_dims_only() -> None:
    assert held_bytes({"p": {"S": (1, 2, 3), "B": (4,)}}, COUNT) == 3.0
    # a dim that holds no gear holds no graph and sizes no buffer
    buffered = {"p": {"S": Prices(Line(), bytes=Line(1.0), buffers=Line(0.0, 1.0))}}
    assert held_bytes({"p": {"S": []}}, buffered) == 0.0


def _ledger(config: PolicyConfig) -> DeviceLedger:
    p = ProfileLedger.new(DIMS["p"], 0.0, config)
    values = np.random.default_rng(0).integers(1, 1025, 2000)
    p.stats["S"].fold(np.linspace(0.0, 200.0, values.size), values)
    return DeviceLedger(last_update=0.0, profiles={"p": p})


@pytest.mark.parametrize(("ratio", "most"), [(1.25, 10), (None, 64)])
def test_a_round_keeps_the_gears_within_the_bound(ratio: float | None, most: int) -> None:
    config = PolicyConfig(graph_memory_budget_ratio=ratio, min_window_events=1)
    ledger = _ledger(config)
    prices = {"p": {"S": Prices(Line(), replay=None, bytes=Line(1.0))}}
    for now in np.arange(15.0, 600.0, 15.0):
        round = decide_round(ledger, float(now), None, config, prices=prices)
        if round is not None:
            ledger.apply(round)
    held = len(ledger.profiles["p"].gears["S"].gears)
    assert held <= most and (ratio is not None or held > 10)
    if ratio is not None:  # gears were traded, not only added
        assert held == 10 and set(ledger.profiles["p"].gears["S"].gears) != set(LADDER)


def test_device_usage_reads_a_ledger_as_a_round_prices_it() -> None:
    ledger = _ledger(CFG)
    assert device_usage(ledger, COUNT, CFG) == (8.0, 10.0, 0.0)
    unmeasured = {"p": {"S": Prices(Line())}}  # the model's bytes a graph
    assert device_usage(ledger, unmeasured, CFG) == (
        8.0 * MODEL_GRAPH_BYTES, 10.0 * MODEL_GRAPH_BYTES, 0.0)
    assert device_usage(ledger, {}, CFG) == (0.0, None, 0.0)


# -- the static buffers: counted once per profile and worker, at its largest gears --

TOKEN = {"p": {"S": Prices(Line(), workers=2, bytes=Line(0.0, 1.0), buffers=Line(0.0, 1.0))}}


def test_the_buffers_count_once_at_the_largest_gear_in_the_start_the_bound_and_held() -> None:
    graphs = 2 * sum(LADDER)  # two workers
    assert start_bytes(DIMS, TOKEN) == graphs + 2 * 1024  # one buffer set a worker, at 1024
    assert bound(DIMS, TOKEN, CFG) == 1.25 * (graphs + 2 * 1024)
    assert held_bytes({"p": {"S": [8, 100]}}, TOKEN) == 2 * 108 + 2 * 100
    assert device_usage(_ledger(CFG), TOKEN, CFG)[2] == 2 * 1024
    one = {"p": {"S": Dim(gears=(1024,), max=1024)}}  # the floor: its graphs beside the buffers
    assert bound(one, TOKEN, CFG) == 2 * (FLOOR_GRAPHS * 1024 + 1024)


def test_unreported_buffers_change_nothing() -> None:
    none = {"p": {"S": dataclasses.replace(TOKEN["p"]["S"], buffers=Line())}}
    assert start_bytes(DIMS, none) == 2 * sum(LADDER)
    assert held_bytes({"p": {"S": [8, 100]}}, none) == 2 * 108


def test_a_profile_of_several_dims_counts_its_buffers_once() -> None:
    dims = {"p": {"S": Dim(gears=(8, 16), max=64), "B": Dim(gears=(2, 4), max=8)}}
    both = {"p": {"S": Prices(Line(), bytes=Line(1.0), buffers=Line(0.0, 4.0)),  # 4·S·B0, B0=4
                  "B": Prices(Line(), bytes=Line(1.0), buffers=Line(0.0, 16.0))}}  # at S=16
    assert start_bytes(dims, both) == 4 + 64
    assert held_bytes({"p": {"S": [8, 32], "B": [4]}}, both) == 3 + 128  # S moved: its line


def test_with_the_buffers_reported_a_round_decides_as_under_the_room_they_leave() -> None:
    """Reported, the buffers join the start (the bound) and what is held, once: a round then
    decides as one without them under a bound in bytes of the room that leaves the graphs."""
    prices = {"p": {"S": Prices(Line(), bytes=Line(0.0, 1.0), buffers=Line(0.0, 2.0))}}
    room = 1.25 * (sum(LADDER) + 2 * 1024) - 2 * 1024
    plain = {"p": {"S": dataclasses.replace(prices["p"]["S"], buffers=Line())}}
    gears = []
    for config, priced in ((CFG, prices), (PolicyConfig(graph_memory_budget_bytes=room), plain)):
        config = dataclasses.replace(config, min_window_events=1)
        ledger = _ledger(config)
        for now in np.arange(15.0, 600.0, 15.0):
            round = decide_round(ledger, float(now), None, config, prices=priced)
            if round is not None:
                ledger.apply(round)
        gears.append(ledger.profiles["p"].gears["S"].gears)
    assert gears[0] == gears[1] and gears[0] != LADDER
    assert sum(gears[0]) > 1.25 * sum(LADDER)  # more room than the bound without the buffers
