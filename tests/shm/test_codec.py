from __future__ import annotations

import msgpack
import pytest

from gearshift.errors import PayloadError
from gearshift.shm import codec


def test_round_trip_keeps_maps_with_int_keys_bytes_and_floats() -> None:
    obj = {"gears": [1, 2, 4], "protected": {64: 12.5}, "blob": b"\x00\xff"}
    assert codec.unpack(codec.pack(obj), 1000) == obj


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xc1",  # never-used type byte
        msgpack.packb(msgpack.ExtType(1, b"ab")),  # ext types are refused
        b"\xdd\xff\xff\xff\xff",  # array header claiming 4 G items in 5 bytes
        b"\xdb\xff\xff\xff\xff" + b"x" * 10,  # str header claiming 4 GB
        msgpack.packb([1, 2]) + b"\x01",  # trailing bytes
    ],
)
def test_malformed_or_oversized_input_is_a_payload_error(data: bytes) -> None:
    with pytest.raises(PayloadError):
        codec.unpack(data, 1000)


def test_input_over_the_limit_is_refused_before_decoding() -> None:
    with pytest.raises(PayloadError, match="exceeds the limit"):
        codec.unpack(codec.pack("x" * 100), 50)


@pytest.mark.parametrize("obj", [object(), 2**70, {1j: 1}])
def test_unencodable_objects_are_a_payload_error(obj: object) -> None:
    with pytest.raises(PayloadError):
        codec.pack(obj)


@pytest.mark.parametrize(
    "data",
    [
        b"\x81\x90\x00",  # a map whose key is a list (unhashable: TypeError inside msgpack)
        b"\x81\x80\x00",  # a map as key
        b"\x91" * 5000 + b"\x00",  # nested deeper than the decoder's stack
    ],
)
def test_every_decoding_failure_is_a_short_payload_error(data: bytes) -> None:
    with pytest.raises(PayloadError) as info:
        codec.unpack(data, 10_000)
    assert len(str(info.value)) < 200
