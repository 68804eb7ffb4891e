"""`gearshift fleet status URL` on a directory store."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from gearshift.clock import WallClock
from gearshift.controller.cli_fleet import fleet
from gearshift.controller.fleetcodec import Entry, encode
from gearshift.controller.fleetstore import POINTER, Store
from gearshift.core.fleet import Compact, Member


def _publish(store: Store, node: str, gears: tuple[int, ...], published: float) -> None:
    c = Compact(np.array([40]), np.array([3.0]), np.array([3]), np.array([1.0]), 10.0)
    member = Member(node, 0.0, {"B": gears}, {"B": c}, {"B": c})
    store.publish(node, encode(node, published, [Entry("k\nrest", "decode", 0, member)]),
                  published)


def test_fleet_status_lists_nodes_gears_side_by_side_and_their_disagreement(
        tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    now = WallClock().now()
    _publish(store, "a", (1, 8, 40), now - 5)
    _publish(store, "b", (1, 8, 64), now - 5)
    _publish(store, "gone", (1, 2), now - 5000)
    (tmp_path / "nodes" / "junk").mkdir()
    (tmp_path / "nodes" / "junk" / POINTER).write_bytes(b"\xc1")
    out = CliRunner().invoke(fleet, ["status", str(tmp_path), "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert [n["node"] for n in doc["nodes"]] == ["a", "b"]
    assert [n["node"] for n in doc["expired"]] == ["gone"]
    assert [n["node"] for n in doc["bad"]] == ["junk"]
    (p,) = doc["profiles"]
    assert p["gears"]["B"] == {"a": [1, 8, 40], "b": [1, 8, 64]}
    assert p["disagreement"]["B"] == 0.5
    text = CliRunner().invoke(fleet, ["status", str(tmp_path)]).output
    assert "2 live nodes, 1 expired, 1 left out" in text and "disagreement 0.50" in text
    assert "1 8 40" in text


def test_fleet_status_of_an_unknown_protocol_exits_2() -> None:
    out = CliRunner().invoke(fleet, ["status", "nosuchproto://x"])
    assert out.exit_code == 2 and "fleet_url" in out.output
