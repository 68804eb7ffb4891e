"""msgpack payloads decoded with limits: the shared-memory boundary trusts no byte it reads.

Decoding refuses ext types, caps every string, binary, array and map at the payload size, and
turns every failure into a PayloadError; encoding turns unencodable objects into one too.
"""

from __future__ import annotations

import msgpack

from gearshift.errors import PayloadError


def pack(obj: object) -> bytes:
    try:
        return msgpack.packb(obj, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise PayloadError(f"payload cannot be encoded as msgpack: {exc}") from None


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
    except (ValueError, msgpack.UnpackException) as exc:
        raise PayloadError(f"payload cannot be decoded: {exc!r}") from None
