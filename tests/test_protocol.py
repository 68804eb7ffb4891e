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
