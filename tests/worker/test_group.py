"""One rank's side of a group (`worker.group.GroupRank`) on fakes: the carried maintenance, the
driver's boundary and plan, every rank's lockstep maintenance, report and exact replay."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest
from fakeclock import FakeClock

import gearshift as gs
from gearshift import protocol
from gearshift.worker import Group
from gearshift.worker.group import REPORT_SECONDS, GroupRank, Maintenance


class Runner:
    def __init__(self, held: set[tuple[int, ...]]) -> None:
        self.gears = {"S": (1,)}
        self.held = set(held)
        self.ran: list[tuple] = []
        self.transform = SimpleNamespace(check=lambda t: {"S": t["n"]},
                                         call=lambda t, s: ("eager", s["S"]))

    def ready(self) -> list[tuple[int, ...]]:
        return sorted(self.held)

    def capture(self, variants) -> int:
        new = {(v["S"],) for v in variants} - self.held
        self.held |= new
        return len(new)

    def release(self, dim: str, gear: int) -> int:
        gone = {v for v in self.held if v[0] == gear}
        self.held -= gone
        return len(gone)

    def run(self, tensors, sizes):
        self.ran.append((dict(self.gears), sizes["S"]))
        return ("graph", self.gears["S"][0])


class Region:
    def __init__(self) -> None:
        self.v, self.payload = 0, None

    def version(self) -> int:
        return self.v

    def read(self):
        return SimpleNamespace(version=self.v, payload=self.payload)

    def usable(self, *gears: int, reported: bool = False, replaced: int = 0,
               at: tuple[int, int] | None = (0, 0)) -> None:
        """Publish `gears` usable; `at`: (epoch, least count) of the reports behind them."""
        self.v += 1
        self.payload = protocol.snapshot_payload(
            0, {"p": {"S": (8, 16, 32)}},
            groups={"p": {"name": "tp", "size": 2, "usable": [(g,) for g in gears],
                          "reported": reported, "replaced": replaced,
                          "at": list(at) if at is not None else None}})


TP0 = Group("tp", 0, 2)


def _rank(held: set | tuple = (), gears: tuple = (8, 16, 32), group: Group | None = TP0,
          started: bool = True) -> tuple[GroupRank, Region, Runner, list[dict], list[dict]]:
    """A driver's GroupRank on fakes; `started`: past its first boundary (which resets)."""
    sent: list[dict] = []
    requests: list[dict] = []

    @contextmanager
    def request(**sizes: int):
        requests.append(sizes)
        yield

    profile = SimpleNamespace(group=group, name="p", dims={"S": gs.Dim(max=64)}, id=3,
                              gears={"S": tuple(gears)}, registered=True, request=request)
    client = SimpleNamespace(region=Region(), clock=FakeClock(0.0),
                             _registrations=SimpleNamespace(send=lambda m: sent.append(m) or True))
    runner = Runner(set(held))
    rank = GroupRank(client, profile, runner)
    if started:
        rank._first = rank._rejoined = False
    return rank, client.region, runner, sent, requests


def test_a_maintenance_rides_as_ints_and_a_garbled_one_is_refused() -> None:
    m = Maintenance(((8, 64), (4, 64)), ((1, 32),))
    assert Maintenance.of(m.carried(), 2) == m
    assert Maintenance.of(list(Maintenance((), ()).carried()), 2) == Maintenance((), ())
    assert Maintenance.of(Maintenance((), (), True).carried(), 2).reset
    assert Maintenance.of((2**63 - 1, 0, 0), 2).reset == 2**63 - 1  # an epoch
    for bad in ((0, 2, 8, 64), (0, 1, 8, 64, 1, 0), (0, 0, 1, 0, 0, 9), (-1, 0, 0), (2**63, 0, 0),
                ("x",), ()):
        with pytest.raises(gs.GroupError):
            Maintenance.of(bad, 2)


def test_the_driver_announces_captures_largest_first_and_releases_what_left_its_gears() -> None:
    rank, region, runner, sent, _ = _rank(held={(4,), (8,)})
    rank.per_boundary = 2
    m = rank.boundary()
    assert m == Maintenance(((32,), (16,)), ((0, 4),))
    region.usable(4, 8)
    assert rank.usable() == {(8,)}  # 4 goes at this boundary: the step after it cannot use it
    rank.maintain(m)
    assert runner.held == {(8,), (16,), (32,)}
    assert sent[-1] == protocol.holds_message(3, [(8,), (16,), (32,)], 0, 1)  # 1 maintenance
    assert rank.boundary() is None  # nothing left to do


def test_a_capture_that_failed_on_the_driver_is_not_announced_again_and_is_released_later(
) -> None:
    """Before: the driver, lacking a variant whose capture failed on it, announced it again at
    every boundary; the others, holding it, skip a capture of what they hold, so the driver
    alone ran its warm-up's and capture's collectives (a hang until the engine's timeout). It
    is now left out until it leaves the gears, and then released on every rank together."""
    rank, _, runner, _, _ = _rank(held={(8,), (16,)})
    capture = runner.capture

    def failing(variants) -> int:
        if any(v["S"] == 32 for v in variants):
            raise RuntimeError("out of memory")
        return capture(variants)

    runner.capture = failing
    m = rank.boundary()
    assert m == Maintenance(((32,),), ())
    rank.maintain(m)
    assert rank.stats["capture_failures"] == 1 and (32,) not in runner.held
    assert rank.boundary() is None  # not announced again while 32 is in the gears
    rank.profile.gears = {"S": (8, 16)}
    m = rank.boundary()
    assert m == Maintenance((), ((0, 32),))  # the others' 32 goes with the gear set
    rank.maintain(m)
    runner.capture = capture
    rank.profile.gears = {"S": (8, 16, 32)}
    assert rank.boundary() == Maintenance(((32,),), ())  # a new decision: every rank again


def test_the_plan_is_the_smallest_usable_variant_covering_the_sizes_or_eager() -> None:
    rank, region, _, _, _ = _rank(held={(8,), (16,), (32,)})
    assert rank.plan(S=5) == (0, 0)  # nothing usable yet: eager
    region.usable(8, 32, 64)  # 64: reported by the controller, not held here: not planned
    assert rank.plan(S=5) == (1, 8)
    assert rank.plan(S=9) == (1, 32)  # 16 is held here, not by every rank
    assert rank.plan(S=40) == (1, 0)


def test_a_rank_replays_exactly_what_is_carried_or_refuses_at_once() -> None:
    rank, _, runner, _, requests = _rank(held={(16,)})
    assert rank.replay((4, 16), {"n": 9}) == ("graph", 16)
    assert runner.ran == [({"S": (16,)}, 9)] and requests == [{"S": 9}]
    assert rank.replay((4, 0), {"n": 40}) == ("eager", 40)
    with pytest.raises(gs.GroupError, match=r"told to replay \{'S': 32\}"):
        rank.replay((5, 32), {"n": 9})
    with pytest.raises(gs.GroupError, match="exceed"):
        rank.replay((4, 16), {"n": 17})
    assert len(runner.ran) == 1 and len(requests) == 2  # refused before running or recording


def test_a_profile_of_no_group_is_refused() -> None:
    with pytest.raises(gs.GroupError, match="declares no group"):
        _rank(group=None)


def test_a_rank_records_its_own_sizes_or_the_max_it_is_given() -> None:
    rank, _, _, _, requests = _rank(held={(16,)})
    rank.replay((4, 16), {"n": 5})
    rank.replay((4, 16), {"n": 5}, recorded={"S": 12})  # data-parallel: the max across ranks
    assert requests == [{"S": 5}, {"S": 12}]


def test_what_a_rank_holds_is_sent_again_every_report_period() -> None:
    rank, _, _, sent, _ = _rank(held={(16,)})
    rank.replay((4, 16), {"n": 5})
    assert len(sent) == 1  # the first report
    rank.replay((4, 16), {"n": 5})
    assert len(sent) == 1
    rank.client.clock.advance(REPORT_SECONDS)
    rank.replay((4, 16), {"n": 5})
    assert len(sent) == 2 and sent[-1] == protocol.holds_message(3, [(16,)])


def test_when_a_rank_lacks_what_the_driver_holds_every_rank_drops_all_and_recaptures() -> None:
    rank, region, runner, _, _ = _rank(held={(8,), (16,), (32,)})
    region.usable(8, 16, 32, reported=True)
    assert rank.boundary() is None and rank.plan(S=5)[1:] == (8,)  # all usable, routed
    region.usable(reported=False)  # a rank's new process registered: nothing usable yet
    assert rank.boundary() is None and rank.plan(S=5)[1:] == (0,)  # eager, no reset yet
    region.usable(reported=True)  # it reported holding nothing
    m = rank.boundary()
    assert m == Maintenance(((32,), (16,)), (), reset=True)
    assert rank.plan(S=5)[1:] == (0,)
    rank.maintain(Maintenance.of(m.carried(), 1))
    assert runner.held == {(32,), (16,)}  # 8 dropped: recaptured at the next boundary
    assert rank.boundary() == Maintenance(((8,),), ())  # not reset again while reports lag
    assert rank.stats["resets"] == 1


def test_a_restarted_controller_before_every_report_is_in_makes_no_reset() -> None:
    rank, region, _, _, _ = _rank(held={(8,), (16,), (32,)})
    region.usable(8, 16, 32, reported=True)
    rank.usable()
    region.usable()  # a new controller: no report yet
    assert rank.boundary() is None and rank.stats["resets"] == 0


def test_a_new_driver_resets_the_group_at_its_first_boundary_uncounted() -> None:
    rank, _, runner, _, _ = _rank(held={(8,)}, started=False)  # followers may hold graphs
    m = rank.boundary()  # and probes of a replaced driver
    assert m == Maintenance(((32,), (16,)), (), reset=True) and rank.stats["resets"] == 0
    rank.maintain(m)
    assert runner.held == {(32,), (16,)} and rank.boundary() == Maintenance(((8,),), ())


def test_a_rank_replaced_before_anything_was_usable_resets_the_group() -> None:
    rank, region, runner, _, _ = _rank(held={(32,)})  # captured, never seen usable
    region.usable(reported=True)  # every rank reported, 32 not (yet) usable
    assert rank.boundary() == Maintenance(((16,), (8,)), ())  # no reset: reports may lag
    region.usable(reported=True, replaced=1)  # a rank's process was replaced meanwhile
    m = rank.boundary()  # it lacks 32 and the probes: every rank drops all and recaptures
    assert m == Maintenance(((32,), (16,)), (), reset=True) and rank.stats["resets"] == 1
    rank.maintain(m)
    assert runner.held == {(32,), (16,)} and rank.boundary() == Maintenance(((8,),), ())


def test_a_restarted_controller_counting_replaced_ranks_anew_makes_no_reset() -> None:
    rank, region, _, _, _ = _rank(held={(8,), (16,), (32,)})
    region.usable(8, 16, 32, reported=True, replaced=2)
    assert rank.boundary() is None
    region.usable(8, 16, 32, reported=True, replaced=0)  # a new controller counts from 0
    assert rank.boundary() is None and rank.stats["resets"] == 0


def test_a_capture_that_raises_is_left_out_and_the_step_goes_on() -> None:
    rank, _, runner, sent, _ = _rank()

    def out_of_memory(variants) -> int:
        raise RuntimeError("out of memory while capturing")  # a backend's, not gearshift's

    runner.capture = out_of_memory
    rank.maintain(Maintenance(((32,),), ()))
    assert rank.stats["capture_failures"] == 1 and runner.held == set()
    assert sent[-1] == protocol.holds_message(3, [], 0, 1)  # it reports that it lacks it


def test_every_rank_reports_the_epoch_of_its_last_reset_and_the_maintenances_since() -> None:
    rank, _, _, sent, _ = _rank()
    rank.maintain(Maintenance((), (), 42))  # a reset: epoch 42, counted from 0
    assert (sent[-1]["epoch"], sent[-1]["count"]) == (42, 1)
    rank.maintain(Maintenance(((8,),), ()))
    assert (sent[-1]["epoch"], sent[-1]["count"]) == (42, 2)
    rank.maintain(Maintenance((), (), 43))
    assert (sent[-1]["epoch"], sent[-1]["count"]) == (43, 1)


def test_a_driver_s_resets_carry_ever_larger_epochs() -> None:
    rank, _, _, _, _ = _rank(started=False)
    first = rank.boundary()
    assert first is not None and first.reset >= 1
    rank.maintain(first)
    rank._rejoined = True  # a rank was replaced
    second = rank.boundary()
    assert second is not None and second.reset > first.reset


def test_a_stale_report_from_before_a_release_does_not_make_a_failed_recapture_usable() -> None:
    """Gear 32 is released at one boundary and captured again at a later one, where rank 1's
    capture fails; the controller still has rank 1's report from before the release (holding
    32) beside rank 0's after the recapture: 32 is in the published usable set, but the
    reports' least count is before its recapture, so the driver does not plan it."""
    rank, region, runner, _, _ = _rank(started=False)
    m = rank.boundary()  # the driver's first boundary: a reset into a new epoch
    rank.maintain(m)
    epoch = m.reset
    assert runner.held == {(16,), (32,)}
    region.usable(16, 32, reported=True, at=(epoch, 1))  # both ranks' reports after it
    assert rank.plan(S=20)[1:] == (32,)
    rank.profile.gears = {"S": (8, 16)}  # 32 leaves the gear set
    m = rank.boundary()
    assert m == Maintenance(((8,),), ((0, 32),))
    rank.maintain(m)  # count 2: every rank releases 32
    rank.profile.gears = {"S": (8, 16, 32)}  # and comes back before the reports are read
    m = rank.boundary()
    assert m == Maintenance(((32,),), ())
    rank.maintain(m)  # count 3: rank 1's capture of 32 fails there
    region.usable(16, 32, reported=True, at=(epoch, 1))  # rank 1's stale report, rank 0's fresh
    assert rank.plan(S=20)[1:] == (0,)  # not 32: rank 1 would raise GroupError
    assert rank.plan(S=12)[1:] == (16,)  # captured before every report
    assert rank.boundary() is None and rank.stats["resets"] == 0  # 32 was never seen usable
    region.usable(16, reported=True, at=(epoch, 3))  # rank 1's report after the failure
    assert rank.plan(S=20)[1:] == (0,) and rank.boundary() is None  # partial: unrouted
    region.usable(8, 16, 32, reported=True, at=(epoch, 3))  # had it succeeded everywhere
    assert rank.plan(S=20)[1:] == (32,)


def test_reports_of_another_epoch_or_of_mixed_epochs_make_nothing_usable() -> None:
    rank, region, _, _, _ = _rank(started=False)
    m = rank.boundary()
    rank.maintain(m)
    region.usable(16, 32, reported=True, at=(m.reset - 1, 5))  # reports before the reset
    assert rank.plan(S=5)[1:] == (0,)
    region.usable(16, 32, reported=True, at=None)  # mixed epochs
    assert rank.plan(S=5)[1:] == (0,)
    region.usable(16, 32, reported=True, at=(m.reset, 1))
    assert rank.plan(S=5)[1:] == (16,)
