"""The state file's format both ways (`controller.stateformat`): what is saved reads back
(gears, times, statistics, measurements, a device's memory, groups), files of older formats and
of the code before groups restore, another boot keeps only what carries no time, and what does
not read back is a StateError naming the file (statistics: empty, a group entry: left out,
each with a warning). (The file's life: test_statefile.py.)"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import msgpack
import numpy as np
import pytest

from gearshift.controller import statefile, stateformat
from gearshift.controller.costbook import CostBook
from gearshift.controller.grouprounds import GroupRounds
from gearshift.controller.groups import Groups, Member, Members
from gearshift.core.config import PolicyConfig
from gearshift.core.costs import Measurement
from gearshift.core.dims import Dim
from gearshift.core.gears import DimGears
from gearshift.core.round import DeviceLedger, ProfileLedger
from gearshift.errors import StateError

CONFIG = PolicyConfig()


def _devices(now: float) -> dict[int, DeviceLedger]:
    dims = {"BATCHSIZE": Dim(gears=[1, 8, 64], splittable=True), "SEQLEN": Dim(max=4096, align=16)}
    profile = ProfileLedger.new(dims, now, CONFIG)
    profile.stats["SEQLEN"].fold(np.array([now - 1.0, now]), np.array([700, 900]))
    profile.history["SEQLEN"].fold(np.array([now - 1000.0]), np.array([300]))
    seq = profile.gears["SEQLEN"]
    profile.gears["SEQLEN"] = DimGears(seq.gears, seq.created, {4096: now + 9}, {96: now - 2})
    return {0: DeviceLedger(version=7, last_update=now - 5, profiles={"decode": profile})}


def test_round_trip_keeps_gears_times_stats_and_version(tmp_path: Path) -> None:
    statefile.save(tmp_path, _devices(100.0))
    back = statefile.load(tmp_path, 200.0, CONFIG)
    profile = back[0].profiles["decode"]
    assert back[0].version == 7 and back[0].last_update == 95.0
    assert profile.gear_lists() == {"BATCHSIZE": [1, 8, 64],
                                    "SEQLEN": list(Dim(max=4096).initial_gears)}
    assert profile.gears["BATCHSIZE"].created == {1: 100.0, 8: 100.0, 64: 100.0}
    seq = profile.gears["SEQLEN"]
    assert (seq.protected_until, seq.evicted) == ({4096: 109.0}, {96: 98.0})
    assert (profile.gears["BATCHSIZE"].initial, seq.initial) == ({1, 8, 64}, frozenset())
    assert profile.dims["SEQLEN"].align == 16 and profile.dims["BATCHSIZE"].splittable
    assert profile.stats["SEQLEN"].view(100.0).counts.tolist() == [1, 1]
    assert profile.history["SEQLEN"].view(100.0).values.tolist() == [300, 700, 900]
    profile.stats["SEQLEN"].fold(np.array([101.0]), np.array([500]))  # still feeds its history
    assert profile.history["SEQLEN"].view(101.0).values.tolist() == [300, 500, 700, 900]
    assert [p.name for p in tmp_path.iterdir()] == [statefile.STATE_FILE]  # no temp file left


def test_a_devices_memory_is_kept_checked_and_optional(tmp_path: Path) -> None:
    devices = _devices(100.0)
    devices[0].memory_bytes = 80e9
    blob = stateformat.encode(devices)
    assert stateformat.decode(blob, 100.0, CONFIG)[0].memory_bytes == 80e9
    data = msgpack.unpackb(blob, strict_map_key=False)
    del data["devices"][0]["memory_bytes"]  # a file from before it was kept
    assert stateformat.decode(msgpack.packb(data), 100.0, CONFIG)[0].memory_bytes is None
    for bad in (0, -1.0, 2.0**60, float("nan"), float("inf"), True, "80 GB"):
        data["devices"][0]["memory_bytes"] = bad
        with pytest.raises(StateError, match="device memory"):
            stateformat.decode(msgpack.packb(data), 100.0, CONFIG)


def test_a_file_from_before_the_history_restores_an_empty_one(tmp_path: Path) -> None:
    data = msgpack.unpackb(stateformat.encode(_devices(100.0)), strict_map_key=False)
    del data["devices"][0]["profiles"]["decode"]["history"]
    profile = stateformat.decode(msgpack.packb(data), 100.0, CONFIG)[0].profiles["decode"]
    assert profile.stats["SEQLEN"].view(100.0).total_count == 2
    assert profile.history["SEQLEN"].view(100.0).total_count == 0


def test_the_file_grows_with_the_values_seen_not_with_slices_times_values(
    tmp_path: Path,
) -> None:
    """4,096 distinct values in each of three slices: ~16 B per (slice, value) seen (window
    and history), where dense rows cost 61 slices x 4,096 values x 16 B twice (8 MB)."""
    dims = {"A": Dim(max=8192)}
    profile = ProfileLedger.new(dims, 0.0, CONFIG)
    for k in range(3):
        profile.stats["A"].fold(np.full(4096, k * 10 + 5.0), np.arange(1, 4097))
    statefile.save(tmp_path, {0: DeviceLedger(version=1, profiles={"p": profile})})
    entries = 3 * 4096 + 4096  # the history's one slice holds the values of the window's three
    assert (tmp_path / statefile.STATE_FILE).stat().st_size < 40 * entries
    assert profile.stats["A"].entries + profile.history["A"].entries == entries
    back = statefile.load(tmp_path, 30.0, CONFIG)[0].profiles["p"]
    assert back.stats["A"].view(30.0).counts.tolist() == [3] * 4096


def test_a_file_of_the_dense_format_restores_its_statistics(tmp_path: Path) -> None:
    """Format 1 held every slice row x column; it reads back as the same statistics."""
    devices = _devices(100.0)
    data = msgpack.unpackb(stateformat.encode(devices), strict_map_key=False)
    data["format"] = 1
    profile = data["devices"][0]["profiles"]["decode"]
    for kind, source in (("stats", devices[0].profiles["decode"].stats),
                         ("history", devices[0].profiles["decode"].history)):
        for dim, stats in source.items():
            frozen = stats.frozen()
            acc = np.zeros((len(frozen.keys), len(frozen.values)))
            cnt = np.zeros(acc.shape, np.int64)
            for i, row in enumerate(frozen.rows):
                acc[i, row.cols], cnt[i, row.cols] = row.acc, row.cnt
            state = profile[kind][dim]
            for key in ("sizes", "cols", "cols_width", "cnt_width"):
                del state[key]
            state.update(acc=acc.astype("<f8").tobytes(), cnt=cnt.astype("<i8").tobytes())
    (tmp_path / statefile.STATE_FILE).write_bytes(msgpack.packb(data))
    back = statefile.load(tmp_path, 100.0, CONFIG)[0].profiles["decode"]
    assert back.stats["SEQLEN"].view(100.0).values.tolist() == [700, 900]
    assert back.history["SEQLEN"].view(100.0).values.tolist() == [300, 700, 900]


def test_other_boot_keeps_gears_with_fresh_protection(tmp_path: Path) -> None:
    data = msgpack.unpackb(stateformat.encode(_devices(100.0)), strict_map_key=False)
    data["boot_id"] = "another-boot"
    back = stateformat.decode(msgpack.packb(data), 5.0, CONFIG)
    profile = back[0].profiles["decode"]
    assert back[0].version == 7 and back[0].last_update is None
    assert profile.gears["BATCHSIZE"].created == {1: 5.0, 8: 5.0, 64: 5.0}
    assert profile.gears["SEQLEN"].evicted == {}
    assert profile.stats["SEQLEN"].view(5.0).total_count == 0


def test_changed_time_settings_restart_stats_only(tmp_path: Path) -> None:
    statefile.save(tmp_path, _devices(100.0))
    back = statefile.load(tmp_path, 100.0, PolicyConfig(window_seconds=1200.0))  # not the default
    assert back[0].profiles["decode"].stats["SEQLEN"].view(100.0).total_count == 0
    assert back[0].profiles["decode"].gear_lists()["BATCHSIZE"] == [1, 8, 64]


@pytest.mark.parametrize("blob, message", [
    (b"\xc1garbage", "corrupt state"),
    (msgpack.packb({"format": 99, "boot_id": "", "devices": {}}), "newer"),
    (msgpack.packb({"format": 1, "boot_id": "", "devices": {"0": {"version": 1}}}), "corrupt"),
])
def test_bad_files_raise_state_error_naming_the_file(tmp_path: Path, blob: bytes,
                                                     message: str) -> None:
    (tmp_path / statefile.STATE_FILE).write_bytes(blob)
    with pytest.raises(StateError, match=message) as info:
        statefile.load(tmp_path, 0.0, CONFIG)
    assert statefile.STATE_FILE in str(info.value)


def _tampered(tmp_path: Path, change: Callable[[dict], None]) -> None:
    data = msgpack.unpackb(stateformat.encode(_devices(100.0)), strict_map_key=False)
    change(data)
    (tmp_path / statefile.STATE_FILE).write_bytes(msgpack.packb(data))


def _profile(data: dict) -> dict:
    return data["devices"][0]["profiles"]["decode"]


@pytest.mark.parametrize("change, message", [
    (lambda d: _profile(d)["states"]["BATCHSIZE"].update(gears=[-5, 0, 10**6]), "positive ints"),
    (lambda d: _profile(d)["states"]["BATCHSIZE"].update(gears=[1, 8, 10**6]), "outside"),
    (lambda d: d["devices"][0].update(version=2**62), "version 4611686018427387904 is outside"),
    (lambda d: d["devices"].update({-1: d["devices"].pop(0)}), "device -1 is outside"),
    (lambda d: _profile(d)["dims"]["SEQLEN"].update(max=2**64 - 1), "Dim.max"),
    (lambda d: _profile(d)["dims"]["SEQLEN"].update(splittable="no"), "Dim.splittable"),
    (lambda d: _profile(d)["states"].pop("SEQLEN"), "gears of"),
    (lambda d: _profile(d)["states"]["SEQLEN"].update(created={4096: float("nan")}), "finite"),
    (lambda d: d["devices"][0].update(last_update="x"), "finite"),
])
def test_a_restored_file_is_checked_like_a_registration(
    tmp_path: Path, change: Callable[[dict], None], message: str
) -> None:
    _tampered(tmp_path, change)
    with pytest.raises(StateError, match=message):
        statefile.load(tmp_path, 200.0, CONFIG)
    assert statefile.restore(tmp_path, 200.0, CONFIG, fresh_on_corrupt=True) == {}
    assert (tmp_path / (statefile.STATE_FILE + ".corrupt")).exists()


def test_statistics_that_do_not_read_back_sane_start_empty(tmp_path: Path) -> None:
    def poison(data: dict) -> None:
        stats = _profile(data)["stats"]["SEQLEN"]
        stats["values"] = np.array([700, 10**6], "<i8").tobytes()  # over the dim's max

    _tampered(tmp_path, poison)
    profile = statefile.load(tmp_path, 100.0, CONFIG)[0].profiles["decode"]
    assert profile.stats["SEQLEN"].view(100.0).total_count == 0
    assert profile.gear_lists()["BATCHSIZE"] == [1, 8, 64]


def _every(stats: dict, key: str, value: float) -> None:
    """Every entry of the saved array `key` (its dtype and length kept) set to `value`."""
    saved = np.frombuffer(stats[key], "<i8" if key == "values" else "<f8")
    stats[key] = np.full(len(saved), value, saved.dtype).tobytes()


@pytest.mark.parametrize("poison", ["below the dim's min", "weights not finite",
                                    "one value in two columns"])
def test_statistics_unsane_in_any_way_restore_empty_with_a_warning(
    tmp_path: Path, poison: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Saved by `statefile.save`, edited only in the `values` and `acc` arrays every stats
    encoding has (mutations caught: each of the three checks of `_restore_stats` dropped; a
    value below `min` gets there through `DimStats.fold`, which knows no dim)."""
    devices = _devices(100.0)
    profile = devices[0].profiles["decode"]
    if poison == "below the dim's min":
        profile.stats["SEQLEN"].fold(np.array([100.0]), np.array([profile.dims["SEQLEN"].min - 1]))
    statefile.save(tmp_path, devices)
    file = tmp_path / statefile.STATE_FILE
    data = msgpack.unpackb(file.read_bytes(), strict_map_key=False)
    stats = _profile(data)["stats"]["SEQLEN"]
    if poison == "weights not finite":
        _every(stats, "acc", np.inf)  # positive: only the finiteness check refuses it
    elif poison == "one value in two columns":
        _every(stats, "values", 700)
    file.write_bytes(msgpack.packb(data))
    with caplog.at_level(logging.WARNING, "gearshift"):
        back = statefile.load(tmp_path, 100.0, CONFIG)[0].profiles["decode"]
    assert back.stats["SEQLEN"].view(100.0).total_count == 0
    assert any("statistics of decode start empty" in r.getMessage() for r in caplog.records)
    history = back.history["SEQLEN"].view(100.0).values.tolist()  # the fold fed it the value
    assert history == ([] if poison == "below the dim's min" else [300, 700, 900])
    assert back.gear_lists()["BATCHSIZE"] == [1, 8, 64]


def _book() -> CostBook:
    book = CostBook()
    for gear, seconds in ((8, 1e-3), (64, 4e-3), (8, 2e-3)):
        book.add(0, "decode", "BATCHSIZE", Measurement(gear, 0.25, 1 << 20, seconds))
    return book


def test_measurements_round_trip_and_survive_a_reboot(tmp_path: Path) -> None:
    statefile.save(tmp_path, _devices(100.0), _book())
    back = CostBook()
    statefile.load(tmp_path, 200.0, CONFIG, back)
    assert back.measurements(0, "decode") == _book().measurements(0, "decode")
    data = msgpack.unpackb((tmp_path / statefile.STATE_FILE).read_bytes(), strict_map_key=False)
    data["boot_id"] = "another boot"
    rebooted = CostBook()
    stateformat.decode(msgpack.packb(data), 5.0, CONFIG, rebooted)  # they carry no time
    assert len(rebooted.measurements(0, "decode")["BATCHSIZE"]) == 3
    del _profile(data)["costs"]  # a file written before measurements restores with none
    older = CostBook()
    assert stateformat.decode(msgpack.packb(data), 5.0, CONFIG, older)
    assert older.measurements(0, "decode") == {}


@pytest.mark.parametrize("costs, message", [
    ({"HEADS": []}, "unknown dim"),
    ({"BATCHSIZE": [[8, 0.25, 1024]]}, "cost row"),
    ({"BATCHSIZE": [[8, -0.25, 1024, 1e-3]]}, "capture_seconds"),
    ({"BATCHSIZE": [[8, 0.25, 1024, float("nan")]]}, "replay_seconds"),
    ({"BATCHSIZE": [[10**6, 0.25, 1024, 1e-3]]}, "outside"),
    ({"BATCHSIZE": "rows"}, "list of rows"),
    ([], "dim -> rows"),
])
def test_a_broken_measurement_is_a_state_error_and_restores_nothing(
    tmp_path: Path, costs: object, message: str
) -> None:
    _tampered(tmp_path, lambda d: _profile(d).update(costs=costs))
    book = CostBook()
    with pytest.raises(StateError, match=message):
        statefile.load(tmp_path, 200.0, CONFIG, book)
    assert statefile.restore(tmp_path, 200.0, CONFIG, True, book) == {}
    assert book.measurements(0, "decode") == {}



MAIN_FILE = Path(__file__).with_name("data") / "state-format2-464e291.msgpack"


def test_a_file_written_by_the_code_before_groups_restores(tmp_path: Path) -> None:
    """`data/state-format2-464e291.msgpack`: saved by commit 464e291's `statefile.save` (two
    devices, a profile's gears with a protection and an eviction, window and history
    statistics, measurements, a device's memory), before the file held groups. As written
    (another boot): gears, versions, memory and measurements; with this boot's id: its times
    and statistics too."""
    data = msgpack.unpackb(MAIN_FILE.read_bytes(), strict_map_key=False)
    assert data["format"] == 2 and "groups" not in data
    for boot in (data["boot_id"], stateformat.boot_id()):
        (tmp_path / statefile.STATE_FILE).write_bytes(msgpack.packb({**data, "boot_id": boot}))
        book = CostBook()
        back = statefile.load(tmp_path, 200.0, CONFIG, book)
        same = boot == stateformat.boot_id()
        assert sorted(back) == [0, 3] and (back[0].version, back[3].version) == (7, 2)
        assert back[0].memory_bytes == 80e9 and back[0].last_update == (95.0 if same else None)
        decode, trace = back[0].profiles["decode"], back[3].profiles["trace"]
        assert decode.gear_lists()["BATCHSIZE"] == [1, 8, 64]
        assert trace.gear_lists() == {"B": [2, 4, 16]} and trace.dims["B"].max == 64
        assert decode.gears["SEQLEN"].protected_until == ({4096: 109.0} if same else {})
        assert decode.gears["BATCHSIZE"].created == dict.fromkeys([1, 8, 64],
                                                                  100.0 if same else 200.0)
        seen = decode.history["SEQLEN"].view(100.0).values.tolist()
        assert seen == ([300, 700, 900] if same else [])
        assert trace.stats["B"].view(100.0).counts.tolist() == ([2, 1] if same else [])
        assert len(book.measurements(0, "decode")["BATCHSIZE"]) == 2
        assert decode.group is None and trace.group is None


# -- the groups --


def _rounds(devices: dict[int, DeviceLedger]) -> GroupRounds:
    return GroupRounds(Groups(lambda slot, pid: True), devices, CONFIG, lambda *a: None,
                       lambda d: {}, lambda d, now: None, lambda d: None)


B = {"B": Dim(gears=[2, 4, 16], max=64)}


def _grouped(now: float) -> tuple[dict[int, DeviceLedger], GroupRounds]:
    """Devices 0 and 1 holding profiles "trace" (group tp, 2 ranks) and "moe" (group ep, 2 ranks),
    rank 0 of each on device 0; tp's last round at now - 3."""
    devices = {d: DeviceLedger(version=4 + d, profiles={
        name: ProfileLedger.new(B, now, CONFIG) for name in ("trace", "moe")}) for d in (0, 1)}
    rounds = _rounds(devices)
    for group, name in (("tp", "trace"), ("ep", "moe")):
        rounds.groups.profiles[(group, name)] = Members(2, dict(B), {
            r: Member(10 * r + len(name), 1000 + 10 * r + len(name), r) for r in (0, 1)},
            {0: frozenset({(4,)}), 1: frozenset({(4,)})})
        for d in devices.values():
            d.profiles[name].group = group
    rounds.last_update[("tp", "trace")] = now - 3
    return devices, rounds


def test_groups_round_trip_their_members_and_last_round_but_not_the_ranks_reports() -> None:
    devices, rounds = _grouped(100.0)
    back = _rounds({})
    restored = stateformat.decode(stateformat.encode(devices, groups=rounds), 200.0, CONFIG,
                                  groups=back)
    assert back.groups.profiles.keys() == rounds.groups.profiles.keys()
    for key, members in rounds.groups.profiles.items():
        again = back.groups.profiles[key]
        assert (again.size, again.dims, again.ranks) == (members.size, B, members.ranks)
        assert again.holds == {}  # each rank reports again when it registers again
    assert back.last_update == {("tp", "trace"): 97.0}
    assert {(d, n): p.group for d, dev in restored.items() for n, p in dev.profiles.items()} == {
        (0, "trace"): "tp", (1, "trace"): "tp", (0, "moe"): "ep", (1, "moe"): "ep"}


def test_groups_of_another_boot_or_before_groups_existed_are_not_restored() -> None:
    devices, rounds = _grouped(100.0)
    data = msgpack.unpackb(stateformat.encode(devices, groups=rounds), strict_map_key=False)
    for change in ({"boot_id": "another boot"}, {"groups": None}):
        tree = {k: v for k, v in {**data, **change}.items() if v is not None}
        back = _rounds({})
        restored = stateformat.decode(msgpack.packb(tree), 200.0, CONFIG, groups=back)
        assert back.groups.profiles == {} and back.last_update == {}
        assert all(p.group is None for dev in restored.values() for p in dev.profiles.values())
        assert restored[1].profiles["trace"].gear_lists() == {"B": [2, 4, 16]}


def _ep(data: dict) -> dict:
    (entry,) = [e for e in data["groups"] if e["group"] == "ep"]
    return entry


@pytest.mark.parametrize("change, message", [
    (lambda d: _ep(d).update(group="e p"), "group name 'e p' is not"),
    (lambda d: _ep(d).update(size=0), "size 0 is outside [1, 64]"),
    (lambda d: _ep(d).update(size=65), "size 65 is outside [0, 64]"),
    (lambda d: _ep(d).update(size="2"), "size '2' is outside"),
    (lambda d: _ep(d).update(profile=["moe"]), "is not a name"),
    (lambda d: _ep(d).update(profile="absent"), "holds no profile 'absent'"),
    (lambda d: _ep(d)["ranks"][1].__setitem__(0, 2), "rank 2 is outside"),
    (lambda d: _ep(d)["ranks"][1].__setitem__(0, 0), "rank 0 is saved twice"),
    (lambda d: _ep(d)["ranks"][1].__setitem__(1, 1 << 20), "slot 1048576 is outside"),
    (lambda d: _ep(d)["ranks"][1].__setitem__(2, -1), "pid -1 is outside"),
    (lambda d: _ep(d)["ranks"][1].__setitem__(3, 9), "device 9 holds no profile"),
    (lambda d: _ep(d)["ranks"][1].__setitem__(3, True), "device True is outside"),
    (lambda d: _ep(d)["ranks"][1].pop(), "ValueError"),
    (lambda d: _ep(d).update(ranks=[]), "are not 1..2"),
    (lambda d: _ep(d).update(ranks=[[0, 1, 2, 0]] * 3), "are not 1..2"),
    (lambda d: _ep(d).update(last_update=float("nan")), "finite"),
    (lambda d: _ep(d).update(last_update="x"), "finite"),
    (lambda d: _ep(d).update(profile="trace"), "device 0's profile 'trace' is of group 'tp'"),
    (lambda d: d["devices"][1]["profiles"]["moe"]["dims"]["B"].update(max=128),
     "rank 1's device 1 holds 'moe' with other dims"),
    (lambda d: _ep(d).clear(), "KeyError"),
])
def test_a_group_entry_that_does_not_read_back_is_left_out_naming_the_group(
    change: Callable[[dict], None], message: str, caplog: pytest.LogCaptureFixture
) -> None:
    devices, rounds = _grouped(100.0)
    data = msgpack.unpackb(stateformat.encode(devices, groups=rounds), strict_map_key=False)
    change(data)
    back = _rounds({})
    with caplog.at_level(logging.WARNING, "gearshift"):
        restored = stateformat.decode(msgpack.packb(data), 200.0, CONFIG, groups=back)
    assert list(back.groups.profiles) == [("tp", "trace")]  # the others restore
    assert [p.group for p in restored[0].profiles.values()] == ["tp", None]
    (warning,) = [r.getMessage() for r in caplog.records if "not restored" in r.getMessage()]
    named = "'e p'" if "name 'e p'" in message else "None" if message == "KeyError" else "'ep'"
    assert warning.startswith(f"group {named} not restored: ") and message in warning


@pytest.mark.parametrize("groups", [{"tp": []}, "groups", [{}] * 5])
def test_groups_that_are_not_a_short_list_are_left_out_with_a_warning(
    groups: object, caplog: pytest.LogCaptureFixture
) -> None:
    devices, rounds = _grouped(100.0)
    data = msgpack.unpackb(stateformat.encode(devices, groups=rounds), strict_map_key=False)
    data["groups"] = groups  # five entries for four profiles: more than there can be
    back = _rounds({})
    with caplog.at_level(logging.WARNING, "gearshift"):
        restored = stateformat.decode(msgpack.packb(data), 200.0, CONFIG, groups=back)
    assert back.groups.profiles == {} and restored[0].version == 4
    assert "the state file's groups are not restored" in caplog.text
