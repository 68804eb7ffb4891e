"""msgpack payloads decoded with limits: the shared-memory boundary trusts no byte it reads.

Decoding refuses ext types, caps every string, binary, array and map at the payload size, and
turns every failure, whatever the decoder raised (a list as a map key is a TypeError), into a
PayloadError that names the failure's type and a short reason, never the bytes; encoding turns
unencodable objects into one too.
"""

from __future__ import annotations

import msgpack

from gearshift.errors import PayloadError

REASON = 100  # characters of a decoder's message kept in an error


def pack(obj: object) -> bytes:
    try:
        return msgpack.packb(obj, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise PayloadError(f"payload cannot be encoded as msgpack: {type(exc).__name__}: "
                           f"{str(exc)[:REASON]}") from None


def unpack(data: bytes, max_bytes: int) -> object:
    """Decode `data` (at most `max_bytes` long) with no ext types and no container over its size."""
    if len(data) > max_bytes:
        raise PayloadError(f"payload of {len(data)} bytes exceeds the limit of {max_bytes}")
    limit = len(data)
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=False,
            max_str_len=limit,
            max_bin_len=limit,
            max_array_len=limit,
            max_map_len=limit,
            max_ext_len=0,
        )
    except Exception as exc:  # the decoder's failures are of several types: all are one here
        raise PayloadError(f"payload cannot be decoded: {type(exc).__name__}: "
                           f"{str(exc)[:REASON]}") from None
