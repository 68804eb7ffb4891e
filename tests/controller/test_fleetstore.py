"""The fleet store on a plain directory: generations and pointers, expiry, and every object
that is corrupt or hostile left out with its reason while the others are read."""

from __future__ import annotations

import os
from pathlib import Path

import msgpack
import numpy as np
import pytest

from gearshift.controller import fleetcodec
from gearshift.controller.fleetcodec import Entry, decode, encode
from gearshift.controller.fleetstore import KEEP, POINTER, Store, redact
from gearshift.core.costs import Measurement
from gearshift.core.fleet import Compact, Member
from gearshift.errors import PayloadError

WALL = 1.7e9


def _member(node: str) -> Member:
    c = Compact(np.array([3, 40]), np.array([1.5, 7.0]), np.array([2, 9]), np.array([4.0, 0.5]),
                30.0)
    return Member(node, 0.0, {"B": (1, 8, 40, 64)}, {"B": c}, {"B": c},
                  {"B": [Measurement(40, 0.5, 1 << 20, 0.001)]})


def _blob(node: str, published: float = WALL) -> bytes:
    return encode(node, published, [Entry("id", "decode", 0, _member(node))])


def test_a_generation_reads_back_whole_and_aged() -> None:
    gen = decode(_blob("a"), WALL + 10)
    assert gen.node == "a" and gen.published == WALL
    (e,) = gen.entries
    assert (e.identity, e.name, e.device) == ("id", "decode", 0)
    m = e.member
    assert m.elapsed == 10 and m.gears == {"B": (1, 8, 40, 64)}
    assert m.window["B"].values.tolist() == [3, 40] and m.window["B"].span == 30.0
    assert m.costs["B"] == [Measurement(40, 0.5, 1 << 20, 0.001)]


def test_publish_writes_the_pointer_last_and_keeps_the_newest_generations(
        tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    for i in range(4):
        store.publish("a", _blob("a", WALL + i), WALL + i)
    node = tmp_path / "nodes" / "a"
    gens = sorted(p.name for p in node.iterdir() if p.name.startswith("gen-"))
    assert len(gens) == KEEP and not [p for p in node.iterdir() if p.suffix == ".tmp"]
    read = store.read(WALL + 4, 600.0)
    assert [g.published for g in read.generations] == [WALL + 3]
    assert store.read(WALL + 4, 600.0, skip="a").generations == []


def test_a_generation_without_its_pointer_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "nodes" / "b").mkdir(parents=True)
    (tmp_path / "nodes" / "b" / "gen-1-ab.msgpack").write_bytes(_blob("b"))
    read = Store(str(tmp_path)).read(WALL, 600.0)
    assert read.generations == [] and read.bad[0][0] == "b"


def test_a_node_expires_its_ttl_after_its_last_publish(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    store.publish("old", _blob("old"), WALL)
    store.publish("new", _blob("new", WALL + 500), WALL + 500)
    read = store.read(WALL + 700, 600.0)
    assert [g.node for g in read.generations] == ["new"] and read.expired == [("old", WALL)]


def _pointer(tmp_path: Path, node: str, blob: bytes, size: int | None = None,
             published: float = WALL, name: str = "gen-1-ab.msgpack") -> None:
    where = tmp_path / "nodes" / node
    where.mkdir(parents=True, exist_ok=True)
    (where / name).write_bytes(blob)
    (where / POINTER).write_bytes(fleetcodec.pointer(name, len(blob) if size is None else size,
                                                     published))


def _hostile_blob(**changes: object) -> bytes:
    data = msgpack.unpackb(_blob("x"), raw=False)
    entry = data["entries"][0]
    dim = entry["dims"]["B"]
    for key, value in changes.items():
        where, _, field = key.partition(".")
        {"top": data, "entry": entry, "dim": dim, "window": dim["window"]}[where][field] = value
    return msgpack.packb(data, use_bin_type=True)


HOSTILE = {
    "garbage": b"\x93\x01\xc1",
    "not a map": msgpack.packb([1, 2]),
    "newer format": _hostile_blob(**{"top.format": 99}),
    "from the future": _hostile_blob(**{"top.published": WALL + 10 * fleetcodec.MAX_SKEW}),
    "nan time": _hostile_blob(**{"top.published": float("nan")}),
    "another node": _hostile_blob(**{"top.node": "y"}),
    "negative weight": _hostile_blob(**{"window.weights": np.array([-1.0, 1]).tobytes()}),
    "zero count": _hostile_blob(**{"window.counts": np.array([0, 1]).tobytes()}),
    "unsorted values": _hostile_blob(**{"window.values": np.array([40, 3]).tobytes()}),
    "ragged arrays": _hostile_blob(**{"window.ages": np.zeros(5).tobytes()}),
    "gears unsorted": _hostile_blob(**{"dim.gears": [8, 1]}),
    "gear of 2**63": _hostile_blob(**{"dim.gears": [1 << 63]}),
    "bool device": _hostile_blob(**{"entry.device": True}),
    "a cost of inf": _hostile_blob(**{"dim.costs": [[40, float("inf"), 1, 0.1]]}),
    "too many dims": _hostile_blob(**{"entry.dims": {str(i): {} for i in range(9)}}),
    "too many entries": _hostile_blob(**{"top.entries": [{}] * (fleetcodec.MAX_ENTRIES + 1)}),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_corrupt_or_hostile_generation_is_left_out_and_the_others_read(
        tmp_path: Path, case: str) -> None:
    store = Store(str(tmp_path))
    store.publish("good", _blob("good"), WALL)
    _pointer(tmp_path, "x", HOSTILE[case])
    read = store.read(WALL + 1, 600.0)
    assert [g.node for g in read.generations] == ["good"]
    assert [n for n, _ in read.bad] == ["x"]
    if case != "another node":  # the store's check: a generation under its own node only
        with pytest.raises(PayloadError):
            decode(HOSTILE[case], WALL + 1)


def test_objects_of_the_wrong_size_or_kind_are_refused_unread(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    _pointer(tmp_path, "short", _blob("short"), size=10)  # the pointer says another size
    _pointer(tmp_path, "huge", b"\0" * 16, size=fleetcodec.MAX_OBJECT_BYTES + 1)
    link = tmp_path / "nodes" / "link"
    link.mkdir(parents=True)
    os.symlink(tmp_path / "nodes" / "short" / POINTER, link / POINTER)
    big = tmp_path / "nodes" / "bigptr"
    big.mkdir()
    (big / POINTER).write_bytes(b"\0" * (fleetcodec.MAX_POINTER_BYTES + 1))
    (tmp_path / "nodes" / "bad name!").mkdir()
    read = store.read(WALL, 600.0)
    assert read.generations == []
    why = dict(read.bad)
    assert set(why) == {"short", "huge", "link", "bigptr", "bad name!"}
    assert "not a regular object" in why["link"] and "not 10" not in why["huge"]


def test_an_empty_store_reads_as_no_nodes(tmp_path: Path) -> None:
    read = Store(str(tmp_path / "none")).read(WALL, 600.0)
    assert read.generations == read.expired == read.bad == []


@pytest.mark.parametrize(("url", "shown"), [
    ("s3://AKIA:secret@bucket/p?token=secret", "s3://bucket/p"),
    ("https://user:secret@host:8443/p#secret", "https://host:8443/p"),
    ("/mnt/fleet", "/mnt/fleet"),
    ("file:///mnt/fleet?secret", "file:///mnt/fleet"),
])
def test_redact_strips_what_may_carry_a_secret(url: str, shown: str) -> None:
    assert redact(url) == shown and "secret" not in redact(url)


def test_an_unknown_protocol_is_a_config_error() -> None:
    from gearshift.errors import ConfigError

    with pytest.raises(ConfigError, match="fleet_url"):
        Store("nosuchproto://bucket/x")
