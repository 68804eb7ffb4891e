"""The worker's lifecycles (`worker.lifecycle`): every state and transition of a table is
reachable, an event a state does not list raises, and a client and a variant's graph move
only as their tables allow."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import pytest
from fakeclock import FakeClock

import gearshift as gs
from gearshift.errors import StateError
from gearshift.worker import Client, lifecycle, warmup
from gearshift.worker.lifecycle import (
    ATTACHED,
    CAPTURING,
    CLIENT,
    CLOSED,
    FAILED,
    GRAPH,
    NO_CONTROLLER,
    READY,
    REGISTERED,
    RELEASED,
    WANTED,
    Table,
    advance,
)
from worker.fake_controller import FakeController, wait_until
from worker.test_startup import WantingRunner
from worker.test_warmup import ScriptedRunner


def reachable(table: Table, start: str, through: Iterable[str] | None = None) -> set[str]:
    """The states reachable from `start` in one transition or more, passing only `through`
    (None: any state) on the way."""
    seen, todo = set(), [start]
    while todo:
        state = todo.pop()
        for (source, _), target in table.items():
            if source == state and target not in seen:
                seen.add(target)
                if through is None or target in through:
                    todo.append(target)
    return seen


@pytest.mark.parametrize("table, start", [(CLIENT, NO_CONTROLLER), (GRAPH, RELEASED)])
def test_every_state_and_so_every_transition_of_a_table_is_reachable(
    table: Table, start: str
) -> None:
    states = {s for s, _ in table} | set(table.values())
    assert reachable(table, start) | {start} == states
    assert {s for s, _ in table} <= reachable(table, start) | {start}  # every transition's source


def test_an_event_a_state_does_not_list_raises_and_moves_nothing() -> None:
    with pytest.raises(StateError, match="no transition on 'capture' in state 'ready'"):
        advance(GRAPH, READY, "capture")  # a ready graph is never captured again
    machine = lifecycle.Machine(CLIENT, CLOSED)
    with pytest.raises(StateError, match="'attach' in state 'closed'"):
        machine.advance("attach")
    assert machine.state == CLOSED
    assert reachable(CLIENT, CLOSED) == set()  # closed is the end


def test_machines_store_only_what_does_not_rest_and_refuse_an_event_out_of_order() -> None:
    graphs = lifecycle.Machines(GRAPH, (RELEASED, WANTED))
    with pytest.raises(StateError, match="'capture' in state 'released'"):
        graphs.advance((1,), "capture")  # the gears in use do not hold it: never captured
    assert graphs.advance((1,), "capture", WANTED) == CAPTURING
    with pytest.raises(StateError, match="'capture' in state 'capturing'"):
        graphs.advance((1,), "capture", WANTED)  # the stored state wins over the resting one
    assert graphs.state((1,)) == CAPTURING
    graphs.advance((1,), "captured")
    assert graphs.keys(READY) == [(1,)]
    graphs.advance((1,), "release")
    assert graphs.keys(READY) == [] and graphs.state((1,), WANTED) == WANTED  # at rest again


def test_the_warm_up_moves_the_graph_states_it_holds_and_refuses_one_out_of_order() -> None:
    """The states `WarmUp.state` reports are the ones its steps moved through the table (held
    in `graphs`): a capture that failed is failed until a retry, a graph the runner released
    leaves ready at the next step that says so; an event out of order is refused."""
    dims = {"B": gs.Dim(gears=[2, 4], max=8)}
    warm, runner = warmup.WarmUp("p", dims, False, FakeClock()), ScriptedRunner(dims)
    gears, in_use = {"B": (2, 4)}, object()
    runner.fail = {(2,)}
    warm.step(runner, in_use, gears, 0)
    assert [warm.state(gears, v) for v in [(2,), (4,), (8,)]] == [FAILED, READY, RELEASED]
    with pytest.raises(StateError, match="'captured' in state 'ready'"):
        warm.graphs.advance((4,), "captured")
    assert warm.state(gears, (4,)) == READY
    released = runner.release("B", 4)
    warm.step(runner, in_use, {"B": (2,)}, released)
    assert warm.state({"B": (2,)}, (4,)) == RELEASED


def moves(table: Table, seen: list[str], transient: Iterable[str] = ()) -> None:
    """Each change between two observed states is a path of `table` through `transient`
    states only (those a call may pass through between two observations)."""
    for before, after in itertools.pairwise(seen):
        assert before == after or after in reachable(table, before, transient), (before, after)


def test_a_client_moves_as_its_table_says(namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    client = gs.connect(namespace, background=False, register_timeout=0)
    seen = [client.state]
    fake = None
    try:
        prof = client.profile("decode", {"B": gs.Dim(max=64)})
        seen.append(client.state)
        fake = FakeController(namespace)
        client._tick()  # attaches, posts the registration
        seen.append(client.state)
        wait_until(lambda: prof.registered, lambda: (fake.serve(), client._tick()))
        seen.append(client.state)
        later = client.profile("prefill", {"S": gs.Dim(max=64)})  # no reply yet
        seen.append(client.state)
        wait_until(lambda: later.registered, lambda: (fake.serve(), client._tick()))
        seen.append(client.state)
        info = client.registry.controller()
        monkeypatch.setattr(client.registry, "controller", lambda: info._replace(pid=info.pid + 1))
        client._tick()  # another controller: every profile registers again
        seen.append(client.state)
        wait_until(lambda: prof.registered and later.registered,
                   lambda: (fake.serve(), client._tick()))
        seen.append(client.state)
    finally:
        client.close()
        if fake is not None:
            fake.close()
    seen.append(client.state)
    assert seen == [NO_CONTROLLER, NO_CONTROLLER, ATTACHED, REGISTERED, ATTACHED, REGISTERED,
                    ATTACHED, REGISTERED, CLOSED]
    moves(CLIENT, seen)
    with pytest.raises(StateError, match="'profile' in state 'closed'"):
        client.profile("late", {"B": gs.Dim(max=64)})
    client.close()  # idempotent: no event


def test_a_variants_graph_moves_as_its_table_says(client: Client, fake: FakeController) -> None:
    """Observed between swap-thread rounds (`WarmUp.state`): deferred (wanted), captured at
    once, wanted by a request, failed, retried, released; a gear dropped and added back."""
    dims = {"B": gs.Dim(gears=[1, 2, 4, 8], max=16)}
    prof = client.profile("p", dims)  # start-up gears 1, 2, 4 deferred
    runner = prof.attach(WantingRunner(dims))
    variants = [(1,), (2,), (4,), (8,), (16,)]
    history: list[dict[tuple[int, ...], str]] = []

    def observe() -> None:
        history.append({v: prof._warmup.state(prof.gears, v) for v in variants})

    def tick() -> None:
        client._tick()
        observe()

    observe()
    tick()  # the largest captured at once, the start-up gears deferred
    runner.fail = {(2,), (1,)}
    runner.want((2,), (4,), (1,))
    tick()  # 2 and 1 fail, 4 is captured
    runner.fail = {(1,)}
    client.clock.sleep(1.0)
    tick()  # the retries: 2 is captured, 1 fails again
    fake.publish({"p": {"B": [2, 4, 16]}})  # 1 and 8 go, 16 comes
    tick()
    fake.publish({"p": {"B": [2, 4, 8, 16]}})  # 8 back, an ordinary gear now
    tick()
    assert [h[(8,)] for h in history] == [WANTED, READY, READY, READY, RELEASED, READY]
    assert [h[(1,)] for h in history] == [WANTED, WANTED, FAILED, FAILED, RELEASED, RELEASED]
    assert [h[(16,)] for h in history] == [RELEASED] * 4 + [READY] * 2
    for v in variants:
        moves(GRAPH, [h[v] for h in history], transient={WANTED, CAPTURING})
    covered = {(h[v], g[v]) for v in variants for h, g in itertools.pairwise(history)}
    assert {(WANTED, READY), (WANTED, FAILED), (FAILED, READY), (READY, RELEASED),
            (FAILED, RELEASED), (RELEASED, READY)} <= covered
