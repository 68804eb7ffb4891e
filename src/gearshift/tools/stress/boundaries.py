"""The boundaries `fuzz` attacks: per shared structure and per file input, a hypothesis strategy
of cases and the attack that writes one into a `target.Live` namespace (or a file) and lets it
run.
"""

from __future__ import annotations

import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import msgpack
import numpy as np

from gearshift import protocol
from gearshift.controller.config import load_configs
from gearshift.errors import ConfigError, GearshiftError, ShapeError, TraceError
from gearshift.shm import EVENT_DTYPE, control, mailbox, ring, snapshot
from gearshift.tools.simulate import policy_dims, simulate
from gearshift.tools.stress.target import (
    DIMS,
    LIVE_SLOTS,
    POLICY,
    STALL_SECONDS,
    WALL,
    Live,
    Tally,
    live,
)
from gearshift.tools.trace import load_trace

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

class Boundary(NamedTuple):
    name: str
    cases: SearchStrategy[Any]
    attack: Callable[[Any, Tally], None]


# -- shared structures --

def _ring_header(case: tuple[bool, bool, list[tuple[int, int]]], tally: Tally) -> None:
    client_side, unsealed, writes = case
    with live(tally) as lv:
        if lv is None:
            return
        target = lv.client.ring if client_side else lv.ring
        if unsealed:  # as if its creator had not sealed it yet
            target._words[0] = 0
        for index, value in writes:
            target._words[index] = value
        lv.run()


def _ring_records(case: tuple[bytes, list[dict[str, Any]]], tally: Tally) -> None:
    raw, fields = case
    with live(tally) as lv:
        if lv is None:
            return
        lv.hostile(protocol.register_message(0, "fuzz", DIMS))
        records = np.zeros(len(fields), EVENT_DTYPE)
        for i, f in enumerate(fields):
            for name, value in f.items():
                records[name][i] = value
        data = records.tobytes() + raw
        count = min(-(-len(data) // ring.RECORD), lv.ring.capacity)
        lv.ring._mm[ring.RECORDS: ring.RECORDS + min(len(data), count * ring.RECORD)] = \
            data[: count * ring.RECORD]
        lv.ring._words[ring.HEAD // 8] = count  # published as a producer would
        lv.run()


def _snapshot_header(writes: list[tuple[int, int]], tally: Tally) -> None:
    with live(tally) as lv:
        if lv is None:
            return
        region = lv.region()
        second = (snapshot.BUFFERS + snapshot.PAYLOAD + region.capacity) // 8
        for index, value in writes:
            at = index if index < 24 else second + index - 24
            region._words[at] = value
        lv.run()


def _snapshot_payload(data: bytes, tally: Tally) -> None:
    with live(tally) as lv:
        if lv is None:
            return
        publish_raw(lv.region(), data)
        lv.run()


def publish_raw(region: snapshot.SnapshotRegion, data: bytes) -> None:
    """What `publish` writes, but of any bytes: a CRC-valid payload that is not ours."""
    words, state = region._words, region._words[snapshot.STATE // 8] & ~1
    version, target = (state >> 2) + 1, 1 - ((state >> 1) & 1)
    base = region._buffer(target)
    data = data[: region.capacity]
    words[base // 8] = 2 * version - 1
    region._mm[base + snapshot.PAYLOAD: base + snapshot.PAYLOAD + len(data)] = data
    words[(base + snapshot.LENGTH) // 8] = len(data)
    words[(base + snapshot.CRC) // 8] = zlib.crc32(data)
    words[base // 8] = 2 * version
    words[snapshot.STATE // 8] = version << 2 | target << 1


def _slot_words(case: list[tuple[int, int, int]], tally: Tally) -> None:
    with live(tally) as lv:
        if lv is None:
            return
        words, size = lv.registry._words, lv.registry._slot_size
        for which, index, value in case:
            if which == 3:  # the header line: closed, controller, its heartbeat, lock owner
                words[(control.CLOSED, control.CONTROLLER, control.CONTROLLER_BEAT,
                       control.LOCK_OWNER)[index % 4] // 8] = value
                continue
            slot = (lv.client.slot, lv.slot, lv.registry.nslots - 1)[which]
            words[(control.TABLE + slot * size) // 8 + index] = value
        lv.run()


def _mailbox(case: tuple[bool, bytes, int, int], tally: Tally) -> None:
    to_controller, data, length, posted = case
    with live(tally) as lv:
        if lv is None:
            return
        box = (lv.registry.requests(lv.slot) if to_controller
               else lv.registry.replies(lv.client.slot))
        words, at = box.segment.words, box.offset // 8
        start = box.offset + mailbox.PAYLOAD
        box.segment.mm[start: start + min(len(data), box.capacity)] = data[: box.capacity]
        words[at + mailbox.LENGTH // 8] = length
        words[at + mailbox.POSTED // 8] = posted
        lv.run()


def _registration(case: tuple[Any, Any, dict[str, Any]], tally: Tally) -> None:
    local, name, fields = case
    message = {"op": "register", "profile": local, "name": name,
               "dims": [["S", {**protocol.dim_to_dict(DIMS["S"]), **fields}]]}
    try:
        if len(mailbox.codec.pack(message)) > control.DEFAULT_MAILBOX_CAPACITY:
            return  # a worker cannot post it: the mailbox refuses it at `post`
    except GearshiftError:
        return  # not even msgpack: the mailbox boundary's cases cover raw bytes
    with live(tally) as lv:
        if lv is None:
            return
        if lv.hostile(message) is None:
            tally.fail("crashes", f"no reply to a registration of {str(fields)[:120]}")
        lv.run()


# -- files --

def _state_file(case: tuple[list[tuple[int, Any]], bytes | None], tally: Tally) -> None:
    changes, raw = case
    blob = raw if raw is not None else _mutated(_good_state(), changes)
    with live(tally, state=blob) as lv:
        if lv is not None:
            lv.run()
            return
    with live(tally, state=blob, fresh=True) as lv:  # refused: --fresh-on-corrupt-state starts
        if lv is None:
            tally.fail("crashes", "a refused state file also stops a fresh start")
        else:
            lv.run()


_GOOD: list[bytes] = []


def _good_state() -> bytes:
    """A state file of a namespace that ran: gears, statistics, versions (made once)."""
    if not _GOOD:
        with tempfile.TemporaryDirectory(prefix="gearshift-fuzz-") as directory:
            lv = Live(Tally(), Path(directory))
            lv.run(20)
            lv.close()
            _GOOD.append((Path(directory) / "gearshift-state.msgpack").read_bytes())
    return _GOOD[0]


def _mutated(blob: bytes, changes: list[tuple[int, Any]]) -> bytes:
    """`blob` with the leaves picked by `changes` (index into a walk of the tree) replaced."""
    data = msgpack.unpackb(blob, raw=False, strict_map_key=False)
    slots: list[tuple[Any, Any]] = []

    def walk(node: Any) -> None:
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in list(items):
            slots.append((node, key))
            if isinstance(value, (dict, list)):
                walk(value)

    walk(data)
    for index, value in changes:
        node, key = slots[index % len(slots)]
        node[key] = value
    try:
        return msgpack.packb(data, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        return blob[: len(blob) // 2]


def _toml(text: str, tally: Tally) -> None:
    with tempfile.TemporaryDirectory(prefix="gearshift-fuzz-") as directory:
        path = Path(directory) / "config.toml"
        path.write_text(text)
        try:
            policy, config = load_configs(path)
        except ConfigError:
            tally.refused += 1
            return
        except Exception as e:
            tally.fail("crashes", f"load_configs: {type(e).__name__}: {e}")
            return
    if config.slots < LIVE_SLOTS:  # valid, but the harness's live client and hostile worker
        tally.refused += 1  # need a slot each: all slots held is the namespace's right answer
        return
    with live(tally, policy=policy, config=config) as lv:
        if lv is not None:
            lv.run()


def _trace(text: str, tally: Tally) -> None:
    with tempfile.TemporaryDirectory(prefix="gearshift-fuzz-") as directory:
        path = Path(directory) / "trace.csv"
        path.write_text(text)
        began = WALL.now()
        try:
            trace = load_trace(path)
            dims = policy_dims(trace, "adaptive")
        except (TraceError, ShapeError):
            tally.refused += 1
            return
        try:
            simulate(trace, dims, POLICY)
        except Exception as e:
            tally.fail("crashes", f"simulate: {type(e).__name__}: {str(e)[:120]}")
        took = WALL.now() - began
        if took > 10 * STALL_SECONDS:
            tally.fail("stalls", f"a trace of {trace.events} events took {took:.1f} s")


_KEYS = ["window_seconds", "half_life_seconds", "slice_seconds", "check_interval_seconds",
         "plan_history_seconds", "recent_use_protect_seconds", "max_gears_per_type",
         "add_min_samples", "policy_mode", "plan_max_moves", "slots", "drain_max_events",
         "scan_interval_seconds", "drain_interval_seconds", "nosuchkey"]
def strategies() -> Any:
    """hypothesis's `strategies`, imported on use: hypothesis is the `test` extra's, not the
    product's, and only the fuzz run needs it."""
    try:
        from hypothesis import strategies as st
    except ImportError as e:
        raise ImportError("the fuzz run needs hypothesis, which only the `test` extra installs: "
                          "pip install 'gearshift[test]'", name="hypothesis") from e
    return st


def boundaries() -> tuple[Boundary, ...]:
    """Every boundary, its cases drawn by hypothesis (imported here: `strategies`)."""
    st = strategies()
    u64 = st.one_of(st.integers(0, 2**64 - 1), st.sampled_from(
        [0, 1, 2, 3, 63, 64, 65, 2**16, 2**31, 2**32, 2**32 + 1, 2**62, 2**63 - 1, 2**63,
         2**64 - 1]))
    i64 = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, 1, -1, 16, 17, 512, 513]))
    scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(),
                       st.text(max_size=12), st.binary(max_size=12))
    value = st.recursive(scalar, lambda inner: st.lists(inner, max_size=4)
                         | st.dictionaries(st.text(max_size=8) | st.integers(-5, 70), inner,
                                           max_size=4), max_leaves=12)
    wrong = {  # well-formed, wrong values of each Dim field
        "gears": st.lists(st.integers(-(2**63), 2**64 - 1), max_size=6) | value,
        "min": u64 | value, "max": u64 | value, "align": u64 | value,
        "splittable": st.sampled_from(["no", "false", 0, 1, None]) | value,
        "pad_value": st.sampled_from([float("nan"), float("inf"), "x", None]) | value,
        "cost": st.lists(st.floats(), max_size=6) | value,
    }
    odd_maps = st.builds(  # msgpack maps Python cannot make: a list or a map as a key
        lambda key, value: b"\x81" + _packed(key) + _packed(value),
        st.lists(scalar, max_size=3) | st.dictionaries(st.text(max_size=3), scalar, max_size=2),
        value)
    long = st.text(min_size=1000, max_size=7000)  # what would not fit a reply, quoted whole

    literals = st.sampled_from(["0", "-1", "1", "3", "1e9", "1e300", "inf", "nan", "-inf", "0.001",
                                "true", '"plan"', '"rules"', '"x"', "[1, 2]", "{a = 1}", "4096",
                                "9223372036854775807", "64", "0.5"])
    toml = st.one_of(st.text(max_size=40), st.builds(
        lambda table, lines: (f"[{table}]\n" if table else "") + "".join(lines),
        st.sampled_from(["", "policy", "controller", "polcy", "controler", "policy.x"]),
        st.lists(st.builds(lambda k, v: f"{k} = {v}\n", st.sampled_from(_KEYS), literals),
                 max_size=3, unique_by=lambda line: line.split(" =")[0])),
        st.sampled_from(["", "[policy]\n", "[controller]\n"]))
    size = st.one_of(st.sampled_from(["1", "2", "64", "4096", "100000"]),
                     st.sampled_from(["7.5", "0", "-3", "1e30", "9.2e18", "nan", "inf", "x", ""]))
    step_ = st.one_of(st.floats(0, 10, allow_nan=False),
                      st.sampled_from([-1.0, 1e300, float("nan")]))

    @st.composite
    def traces(draw: st.DrawFn) -> str:
        """A trace CSV: a header, then rows of a time and as many cells (wrong ones among them)."""
        header = draw(st.sampled_from(["t,SEQLEN", "t,BATCHSIZE,SEQLEN", "t,SEQLEN,mem_usage",
                                       "t,1bad", "SEQLEN,t"]))
        width, t, lines = header.count(","), 0.0, [header]
        for _ in range(draw(st.integers(0, 30))):
            step = draw(step_)
            t = t + step if 0 <= step <= 10 else step
            lines.append(",".join([str(t), *(draw(size) for _ in range(width))]))
        return "\n".join(lines) + "\n"

    trace = st.one_of(st.text(max_size=120), traces())

    return (
        Boundary("ring header", st.tuples(st.booleans(), st.booleans(), st.lists(
            st.tuples(st.integers(0, 31), u64), max_size=6)), _ring_header),
        Boundary("ring records", st.tuples(st.binary(max_size=256), st.lists(st.fixed_dictionaries(
            {}, optional={"t_ns": i64, "values": st.lists(i64, min_size=4, max_size=4),
                          "version": st.integers(0, 2**32 - 1),
                          "profile": st.integers(0, 2**16 - 1),
                          "kind": st.integers(0, 255), "ndim": st.integers(0, 255),
                          "chunks": st.lists(st.integers(0, 2**16 - 1), min_size=4, max_size=4)}),
            max_size=8)), _ring_records),
        Boundary("snapshot header", st.lists(st.tuples(st.integers(0, 31), u64), min_size=1,
                                             max_size=6), _snapshot_header),
        Boundary("snapshot payload", st.one_of(st.binary(max_size=200), odd_maps, value.map(
            lambda v: _packed({"device": 0, "profiles": {"fuzz": {"gears": v}}})), st.builds(
            lambda s, b: _packed({"device": 0, "profiles": {"fuzz": {"gears": {"S": s, "B": b}}}}),
            st.lists(i64, max_size=5), st.lists(i64, max_size=5))), _snapshot_payload),
        Boundary("slot table words", st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6), u64),
                                              min_size=1, max_size=5), _slot_words),
        Boundary("mailbox messages", st.tuples(
            st.booleans(), st.binary(max_size=300) | odd_maps | value.map(lambda v: _packed(v)),
            u64, u64),
            _mailbox),
        Boundary("registration fields", st.tuples(
            st.one_of(st.just(1), st.integers(-5, 2**17), value, long),
            st.one_of(st.just("other"), value, long),
            st.fixed_dictionaries({}, optional=wrong)), _registration),
        Boundary("state file", st.tuples(st.lists(st.tuples(st.integers(0, 10**6), value | u64),
                                                  max_size=4), st.none() | st.binary(max_size=64)),
                 _state_file),
        Boundary("toml config", toml, _toml),
        Boundary("trace csv", trace, _trace),
    )


def _packed(value: Any) -> bytes:
    try:
        return msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError):
        return b"\xc1"
