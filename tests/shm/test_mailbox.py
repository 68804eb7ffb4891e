from __future__ import annotations

from collections.abc import Iterator

import pytest

from gearshift.errors import GearshiftError, PayloadError, ProfileMismatch, ShapeError
from gearshift.shm import Mailbox, error_reply, mailbox, raise_for_error
from gearshift.shm.segment import Segment
from shm.procs import layout_table

CAPACITY = 256


@pytest.fixture
def box(namespace: str) -> Iterator[Mailbox]:
    segment = Segment.create(f"/gearshift.{namespace}.ctl", 64 + Mailbox.size(CAPACITY))
    yield Mailbox(segment, 64, CAPACITY)
    segment.unlink()
    segment.close()


def test_layout_table_matches_the_code() -> None:
    table = layout_table(mailbox.__doc__, capacity=CAPACITY)
    assert table == {
        "posted": (mailbox.POSTED, 8),
        "taken": (mailbox.TAKEN, 8),
        "length": (mailbox.LENGTH, 8),
        "payload": (mailbox.PAYLOAD, CAPACITY),
    }
    assert Mailbox.size(CAPACITY) == mailbox.PAYLOAD + CAPACITY


def test_one_message_at_a_time_in_order(box: Mailbox) -> None:
    assert box.take() is None
    assert box.post({"n": 1})
    assert not box.post({"n": 2})  # the first was not taken yet
    assert box.take() == {"n": 1}
    assert box.take() is None
    assert box.post({"n": 3})
    assert box.take() == {"n": 3}


def test_messages_stay_inside_their_box(box: Mailbox) -> None:
    before = bytes(box.segment.mm[:64])
    box.post({"blob": b"x" * (CAPACITY - 16)})
    assert bytes(box.segment.mm[:64]) == before


@pytest.mark.parametrize("message", [[1, 2], "text", None])
def test_only_maps_are_messages(box: Mailbox, message: object) -> None:
    with pytest.raises(PayloadError, match="dict"):
        box.post(message)  # type: ignore[arg-type]


def test_an_oversized_message_is_refused(box: Mailbox) -> None:
    with pytest.raises(PayloadError, match="exceeds"):
        box.post({"blob": b"x" * CAPACITY})
    assert box.take() is None


def test_a_malformed_message_is_a_payload_error_and_frees_the_box(box: Mailbox) -> None:
    box.post({"n": 1})
    box.segment.mm[64 + mailbox.PAYLOAD] = 0xC1  # never-used msgpack type byte
    with pytest.raises(PayloadError):
        box.take()
    assert box.post({"n": 2})


def test_reset_empties_the_box(box: Mailbox) -> None:
    box.post({"n": 1})
    box.reset()
    assert box.take() is None


@pytest.mark.parametrize(
    "error", [ProfileMismatch("decode: gears differ"), ShapeError("B = 0 is not positive")]
)
def test_typed_errors_cross_the_reply_path(error: GearshiftError) -> None:
    with pytest.raises(type(error), match=str(error)):
        raise_for_error(error_reply(error))


def test_unknown_errors_arrive_as_gearshift_errors_and_results_pass() -> None:
    with pytest.raises(GearshiftError, match="boom"):
        raise_for_error({"error": "Whatever", "message": "boom"})
    assert raise_for_error({"profile_id": 3}) == {"profile_id": 3}


def test_an_error_reply_always_fits_a_mailbox() -> None:
    reply = error_reply(PayloadError("junk " * 10_000))
    assert len(mailbox.codec.pack(reply)) <= mailbox.MAX_MESSAGE + 64
    with pytest.raises(PayloadError, match="junk"):
        raise_for_error(reply)
