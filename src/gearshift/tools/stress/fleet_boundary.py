"""The fleet store's objects as a fuzz boundary (`fleet()`): a hostile node's pointer or
generation in a fleet directory beside a good node's.

A case is a good generation with drawn leaves replaced (`boundaries._mutated`), or drawn
bytes, written as the hostile node's pointer or generation (its pointer then says a drawn
size, right or wrong). The attack reads the directory as a node does (`fleetstore.Store.read`)
and takes what it read through the fleet's pure part as a controller would (members, prior,
start-up gears, a decision round with the prior). It fails on any exception (`crashes`), a
good node not read beside the hostile one (`lost`), or start-up gears or a round's gears
outside the dims' bounds (`out_of_bounds`); a hostile node left out is `refused`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from gearshift.controller import fleetcodec
from gearshift.controller.fleet import _learn
from gearshift.controller.fleetcodec import Entry, encode
from gearshift.controller.fleetstore import POINTER, Store
from gearshift.core.fleet import Compact, FleetKey, Member, fleet_gears, primed
from gearshift.core.round import DeviceLedger, ProfileLedger, decide_round
from gearshift.core.stats import DimStats
from gearshift.tools.stress.boundaries import Boundary, _mutated, strategies
from gearshift.tools.stress.target import DIMS, POLICY, Tally

NAME = "gen-1-ab.msgpack"
IDENTITY = FleetKey().identity("fuzz", DIMS)


def _good(node: str, wall: float) -> bytes:
    """A generation of `node` published at `wall`: statistics of a few sizes per dim."""
    window, history, gears = {}, {}, {}
    for d, dim in DIMS.items():
        s = DimStats(POLICY, DimStats(POLICY.history()))
        s.fold(np.linspace(0.0, 1.0, 12), np.array([dim.min, dim.max, 3 % dim.max + 1] * 4))
        assert s.history is not None
        window[d], history[d] = Compact.of(s.view(1.0), 1.0), Compact.of(s.history.view(1.0), 1.0)
        gears[d] = tuple(dim.initial_gears)
    return encode(node, wall, [Entry(IDENTITY, "fuzz", 0,
                                     Member(node, 0.0, gears, window, history))])


def _attack(case: tuple[str, list[tuple[int, Any]], bytes | None, int], tally: Tally) -> None:
    kind, changes, raw, lie = case
    wall = 1.7e9
    with tempfile.TemporaryDirectory(prefix="gearshift-fuzz-") as directory:
        store = Store(directory)
        store.publish("good", _good("good", wall), wall)
        where = Path(directory) / "nodes" / "x"
        where.mkdir(parents=True)
        if kind == "pointer":
            good = fleetcodec.pointer(NAME, 1, wall)
            (where / POINTER).write_bytes(raw if raw is not None else _mutated(good, changes))
            (where / NAME).write_bytes(_good("x", wall))
        else:
            blob = raw if raw is not None else _mutated(_good("x", wall), changes)
            (where / NAME).write_bytes(blob)
            (where / POINTER).write_bytes(fleetcodec.pointer(NAME, max(1, len(blob) + lie),
                                                             wall))
        try:
            read = store.read(wall + 1.0, 600.0)
        except Exception as e:
            tally.fail("crashes", f"read: {type(e).__name__}: {str(e)[:160]}")
            return
    if "good" not in [g.node for g in read.generations]:
        tally.fail("lost", f"a hostile {kind} hid the good node: {read.bad[:1]}")
    tally.refused += any(node == "x" for node, _ in read.bad)
    try:
        _decide(read, tally)
    except Exception as e:
        tally.fail("crashes", f"merge: {type(e).__name__}: {str(e)[:160]}")


def _decide(read: Any, tally: Tally) -> None:
    """What a controller does with a read: start-up gears, and a round on the prior."""
    now = 100.0
    learned = _learn(read, now, 1.7e9 + 1.0, POLICY)
    members = learned.members.get(IDENTITY, [])
    gears = fleet_gears(members, DIMS, POLICY.max_gears_per_type) or {}
    for d, g in gears.items():
        if g[0] < DIMS[d].min or g[-1] > DIMS[d].max or len(g) > POLICY.max_gears_per_type:
            tally.fail("out_of_bounds", f"start-up gears {g[:8]} of {d}")
    prior = learned.priors.get(IDENTITY)
    if prior is None:
        return
    ledger = DeviceLedger(profiles={"fuzz": ProfileLedger.new(DIMS, now, POLICY)})
    round = decide_round(ledger, now + 1.0, None, POLICY,
                         prior={"fuzz": primed(prior, now, now + 1.0, POLICY, DIMS)})
    for d, state in (round.gears.get("fuzz", {}) if round else {}).items():
        if state.gears[0] < DIMS[d].min or state.gears[-1] > DIMS[d].max:
            tally.fail("out_of_bounds", f"a round on the prior gave {d} {state.gears[:8]}")


def fleet() -> tuple[Boundary, ...]:
    """The fleet objects' boundary, its cases drawn by hypothesis (`strategies`)."""
    st = strategies()
    scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(),
                       st.text(max_size=12), st.binary(max_size=40))
    value = st.recursive(scalar, lambda inner: st.lists(inner, max_size=4)
                         | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                         max_leaves=10)
    return (Boundary("fleet objects", st.tuples(
        st.sampled_from(["pointer", "generation"]),
        st.lists(st.tuples(st.integers(0, 10**6), value), max_size=4),
        st.none() | st.binary(max_size=64), st.sampled_from([0, 0, 1, -1, 1 << 30])), _attack),)
