"""One-message mailbox inside a segment: one writer, one reader, msgpack map messages.

    offset  size      field    written by  when
    0       8         posted   writer      after length and payload: messages posted so far
    8       8         taken    reader      after the payload was copied: messages taken so far
    16      8         length   writer      while the box is empty
    64      capacity  payload  writer      while the box is empty

The box is full iff posted != taken. The writer touches length and payload only while it is
empty and the reader copies them only while it is full, and each side flips the state with one
aligned 8-byte store made after its own accesses, so the two never overlap: no message is read
torn, and a writer killed mid-message has not posted it. Every worker slot has two: requests
(worker -> controller: profile registration) and replies (controller -> worker: result or error).

Protocol helpers: a reply is either a result map or `error_reply(exc)`, and `raise_for_error`
re-raises the latter in the worker as the same typed exception (e.g. ProfileMismatch). An error
reply's message is cut to MAX_MESSAGE characters, so it fits any mailbox of the default size
whatever the request held.
"""

from __future__ import annotations

from gearshift.errors import (
    GearshiftError,
    LayoutError,
    NamespaceBusy,
    PayloadError,
    ProfileMismatch,
    ShapeError,
    SpaceError,
)
from gearshift.shm import codec
from gearshift.shm.segment import Segment, fence

POSTED, TAKEN, LENGTH, PAYLOAD = 0, 8, 16, 64  # offsets inside a mailbox
MAX_MESSAGE = 1024  # characters of an error reply's message
_REMOTE = (  # one-argument errors
    ProfileMismatch, ShapeError, PayloadError, NamespaceBusy, SpaceError, LayoutError
)
_REMOTE_ERRORS = {cls.__name__: cls for cls in _REMOTE}


class Mailbox:
    """The mailbox at byte `offset` of `segment` with `capacity` payload bytes."""

    def __init__(self, segment: Segment, offset: int, capacity: int) -> None:
        self.segment = segment
        self.offset = offset
        self.capacity = capacity

    @staticmethod
    def size(capacity: int) -> int:
        return PAYLOAD + capacity

    def post(self, message: dict) -> bool:
        """Post `message`; False if the previous one was not taken yet (retry later)."""
        if not isinstance(message, dict):
            raise PayloadError(f"a mailbox message is a dict, got {type(message).__name__}")
        data = codec.pack(message)
        if len(data) > self.capacity:
            raise PayloadError(
                f"message of {len(data)} bytes exceeds the mailbox's {self.capacity}"
            )
        words, at = self.segment.words, self.offset // 8
        posted = words[at + POSTED // 8]
        if posted != words[at + TAKEN // 8]:
            return False
        fence()
        start = self.offset + PAYLOAD
        self.segment.mm[start : start + len(data)] = data
        words[at + LENGTH // 8] = len(data)
        fence()
        words[at + POSTED // 8] = posted + 1
        return True

    def waiting(self) -> bool:
        """Whether a message waits to be taken (one read each of two words)."""
        words, at = self.segment.words, self.offset // 8
        return words[at + POSTED // 8] != words[at + TAKEN // 8]

    def take(self) -> dict | None:
        """Take the waiting message, or None if the box is empty; PayloadError if malformed."""
        words, at = self.segment.words, self.offset // 8
        posted = words[at + POSTED // 8]
        if posted == words[at + TAKEN // 8]:
            return None
        fence()
        start = self.offset + PAYLOAD
        data = self.segment.mm[start : start + min(words[at + LENGTH // 8], self.capacity)]
        fence()
        words[at + TAKEN // 8] = posted
        message = codec.unpack(data, self.capacity)
        if not isinstance(message, dict):
            raise PayloadError(f"a mailbox message is a map, got {type(message).__name__}")
        return message

    def reset(self) -> None:
        """Empty the box; only while neither side uses it (the slot is being claimed)."""
        words, at = self.segment.words, self.offset // 8
        words[at + POSTED // 8] = 0
        words[at + TAKEN // 8] = 0


def error_reply(exc: GearshiftError) -> dict:
    """A reply that makes `raise_for_error` raise `exc`'s type with its message in the worker."""
    message = str(exc)
    if len(message) > MAX_MESSAGE:
        message = message[: MAX_MESSAGE - 3] + "..."
    return {"error": type(exc).__name__, "message": message}


def raise_for_error(reply: dict) -> dict:
    """Return `reply`, or raise the typed error it carries (GearshiftError if not a known type)."""
    if "error" in reply:
        raise _REMOTE_ERRORS.get(reply["error"], GearshiftError)(str(reply.get("message", "")))
    return reply
