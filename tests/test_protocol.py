import re

import pytest

from gearshift import protocol
from gearshift.core.dims import Dim
from gearshift.errors import PayloadError, ShapeError

DIMS = {
    "BATCHSIZE": Dim(gears=[1, 8, 64], splittable=True),
    "SEQLEN": Dim(max=4096, align=16, cost=(2e-4, 2e-6, 1e-9)),
}


def test_registration_round_trip_keeps_dims_and_their_order() -> None:
    msg = protocol.register_message(3, "decode", DIMS)
    assert protocol.parse_register(msg) == (3, "decode", DIMS)
    assert list(protocol.parse_register(msg)[2]) == ["BATCHSIZE", "SEQLEN"]


@pytest.mark.parametrize("change, error", [
    ({"op": "hello"}, PayloadError),
    ({"profile": -1}, PayloadError),
    ({"profile": 1 << 16}, PayloadError),
    ({"name": ""}, PayloadError),
    ({"dims": [["X", {"nonsense": 1}]]}, ShapeError),
    ({"dims": [["X", {"min": 0}]]}, ShapeError),
    ({"dims": [["X", {"cost": [1.0]}]]}, ShapeError),
    ({"dims": []}, ShapeError),
    ({"dims": 5}, PayloadError),
])
def test_malformed_registrations_are_typed_errors(change: dict, error: type) -> None:
    msg = protocol.register_message(0, "decode", DIMS) | change
    with pytest.raises(error):
        protocol.parse_register(msg)


def test_snapshot_payload_gives_back_each_profiles_gears() -> None:
    payload = protocol.snapshot_payload(
        1, {"decode": {"BATCHSIZE": (1, 64)}}, {"decode": [["BATCHSIZE", 8, "evict", "why"]]})
    assert protocol.profile_gears(payload, "decode") == {"BATCHSIZE": (1, 64)}
    assert payload["profiles"]["decode"]["changes"] == [["BATCHSIZE", 8, "evict", "why"]]
    assert protocol.profile_gears(payload, "prefill") is None
    assert protocol.profile_gears({"garbage": 1}, "decode") is None


@pytest.mark.parametrize("fields, named", [
    ({"max": 2**64 - 1}, "Dim.max"),
    ({"splittable": "no"}, "Dim.splittable"),
    ({"pad_value": "x"}, "Dim.pad_value"),
    ({"gears": 5}, "Dim.gears"),
    ({"cost": "12"}, "Dim.cost"),
])
def test_the_controller_refuses_what_the_client_refuses_naming_the_field(
    fields: dict, named: str
) -> None:
    msg = protocol.register_message(0, "decode", {"B": Dim()})
    msg["dims"][0][1].update(fields)
    with pytest.raises(ShapeError, match=named):
        protocol.parse_register(msg)
    with pytest.raises(ShapeError, match=named):
        Dim(**{**protocol.dim_to_dict(Dim()), **fields})  # the client's own check


@pytest.mark.parametrize("change", [
    {"op": "x" * 6000},
    {"profile": "x" * 6000},
    {"dims": [["B" * 6000, {"max": "y" * 6000}]]},
    {"dims": [["B", {"z" * 6000: 1}]]},
    {"dims": [["B", {}], ["B", {}]]},
    {"dims": [[["B"], {}]]},
    {"profile": True},
])
def test_refusals_are_short_whatever_was_sent(change: dict) -> None:
    msg = protocol.register_message(0, "decode", DIMS) | change
    with pytest.raises((PayloadError, ShapeError)) as info:
        protocol.parse_register(msg)
    assert len(str(info.value)) < 300


def test_profile_changes_keeps_only_well_formed_rows() -> None:
    payload = protocol.snapshot_payload(0, {"p": {"S": [1, 2]}}, {"p": [
        ["S", 2, "add", "why"], ["S", True, "add", "bool gear"], ["S", 2, "add"],
        "not a row", [1, 2, "add", "dim not a str"]]})
    assert protocol.profile_changes(payload, "p") == [("S", 2, "add", "why")]
    assert protocol.profile_changes(payload, "other") == []
    assert protocol.profile_changes({"profiles": {"p": {"changes": "x"}}}, "p") == []
    assert protocol.profile_changes(None, "p") == []


def _keys(block: str) -> list[str]:
    return re.findall(r'"(\w+)":', block)


def test_the_module_docstring_gives_the_messages_the_code_builds() -> None:
    """protocol.py's docstring is where the message formats live (docs/architecture.md links to
    it): its registration and snapshot payload name exactly the keys the code writes."""
    doc = protocol.__doc__
    register = doc.split("Registration", 1)[1].split("\n\n", 2)[1]
    assert _keys(register) == list(protocol.register_message(0, "decode", DIMS))
    assert '"op": "register"' in register
    payload = doc.split("Snapshot payload", 1)[1].split("\n\n", 2)[1]
    built = protocol.snapshot_payload(0, {"decode": {"BATCHSIZE": (1, 8)}})
    assert _keys(payload) == [*built, *built["profiles"]["decode"]]


def test_a_group_rides_in_the_registration_and_none_is_absent() -> None:
    from gearshift.core.group import Group

    assert "group" not in protocol.register_message(0, "decode", DIMS)
    assert protocol.parse_group(protocol.register_message(0, "decode", DIMS)) is None
    msg = protocol.register_message(0, "decode", DIMS, Group("tp", 1, 2))
    assert msg["group"] == ["tp", 1, 2]
    assert protocol.parse_group(msg) == Group("tp", 1, 2)
    assert protocol.parse_register(msg) == (0, "decode", DIMS)  # the rest as before
    for bad in ("tp", ["tp", 1], ["tp", 2, 2], ["", 0, 1], ["tp", "0", 2]):
        with pytest.raises(PayloadError):
            protocol.parse_group({**msg, "group": bad})


def test_a_rank_s_holdings_and_the_usable_set_ride_in_their_messages() -> None:
    msg = protocol.holds_message(3, [(8, 64), (16, 64)])
    assert protocol.parse_holds(msg, 2) == (3, frozenset({(8, 64), (16, 64)}), (0, 0))
    for bad in ({**msg, "variants": [[8]]}, {**msg, "variants": [[8, 0]]},
                {**msg, "variants": [[8, True]]}, {**msg, "profile": -1},
                {**msg, "variants": [[1, 1]] * (protocol.MAX_HELD + 1)}):
        with pytest.raises(PayloadError):
            protocol.parse_holds(bad, 2)
    payload = protocol.snapshot_payload(0, {"decode": {"B": (8, 16)}, "plain": {"B": (1,)}},
                                        groups={"decode": {"name": "tp", "size": 2,
                                                           "usable": [(8,)]}})
    assert payload["profiles"]["decode"]["group"] == {"name": "tp", "size": 2, "usable": [[8]]}
    assert protocol.profile_usable(payload, "decode") == {(8,)}
    assert protocol.profile_usable(payload, "plain") is None
    assert "group" not in payload["profiles"]["plain"]
    assert not protocol.profile_reported(payload, "decode")  # no key: not every rank reported
    payload["profiles"]["decode"]["group"]["reported"] = True
    assert protocol.profile_reported(payload, "decode")
    payload["profiles"]["decode"]["group"]["reported"] = 1  # only True is true
    assert not protocol.profile_reported(payload, "decode")


def test_a_report_carries_its_rank_s_epoch_and_count_bounded_and_an_older_one_reads_as_0() -> None:
    msg = protocol.holds_message(3, [(8,)], 7, 12)
    assert protocol.parse_holds(msg, 1) == (3, frozenset({(8,)}), (7, 12))
    top = protocol.MAX_MARK
    assert protocol.parse_holds({**msg, "epoch": top, "count": top}, 1)[2] == (top, top)
    old = {k: v for k, v in msg.items() if k not in ("epoch", "count")}  # an older worker's
    assert protocol.parse_holds(old, 1)[2] == (0, 0)  # no driver's epoch is 0: never usable
    for key in ("epoch", "count"):
        for bad in (-1, top + 1, True, 1.0, "7", None, [7]):
            with pytest.raises(PayloadError, match="epoch and count"):
                protocol.parse_holds({**msg, key: bad}, 1)


def test_the_usable_set_s_epoch_and_least_count_are_read_validated() -> None:
    group = {"name": "tp", "size": 2, "usable": [(8,)], "at": [7, 12]}
    payload = protocol.snapshot_payload(0, {"decode": {"B": (8,)}}, groups={"decode": group})
    assert protocol.profile_usable_at(payload, "decode") == (7, 12)
    assert protocol.profile_usable_at(payload, "plain") is None
    for bad in (None, [7], [7, 12, 1], [-1, 3], [7, True], [7, 1.5], "7,12", [7, 2**63]):
        payload["profiles"]["decode"]["group"]["at"] = bad
        assert protocol.profile_usable_at(payload, "decode") is None
    del payload["profiles"]["decode"]["group"]["at"]  # an older controller's: nothing usable
    assert protocol.profile_usable_at(payload, "decode") is None
    assert not protocol.profile_reported(payload, "plain")
    assert not protocol.profile_reported(None, "decode")
