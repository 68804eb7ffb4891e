"""Trace loading: shipped names, paths, and one clear TraceError per kind of bad input."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from gearshift.errors import TraceError
from gearshift.tools.trace import load_trace, shipped_traces


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


def test_shipped_traces_load_by_name() -> None:
    names = shipped_traces()
    assert "azure_code_prefill" in names and len(names) == 6
    trace = load_trace("azure_code_batched")
    assert set(trace.dims) == {"BATCHSIZE", "SEQLEN"}
    assert trace.events == 3738 and trace.mem_usage is None
    assert all(col.dtype == np.int64 and col.size == trace.events for col in trace.dims.values())
    assert np.all(np.diff(trace.t) >= 0)


def test_path_with_memory_column(tmp_path: Path) -> None:
    trace = load_trace(write(tmp_path, "t,SEQLEN,mem_usage\n0,5,0.5\n1.5,7,0.95\n1.5,1,0\n"))
    assert trace.name == "trace"
    assert trace.t.tolist() == [0, 1.5, 1.5]
    assert trace.dims["SEQLEN"].tolist() == [5, 7, 1]
    assert trace.mem_usage.tolist() == [0.5, 0.95, 0.0]
    assert trace.duration == 1.5


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("t,SEQLEN\n0,5\n1,2.5\n", "line 3: SEQLEN=2.5 is not an integer size"),
        ("t,SEQLEN\n0,5\n1,0\n", "line 3: SEQLEN=0 is not a positive size"),
        ("t,SEQLEN\n0,-3\n", "line 2: SEQLEN=-3 is not a positive size"),
        ("t,SEQLEN\n0,nan\n", "line 2: SEQLEN=nan is not an integer size"),
        ("t,SEQLEN\n0,5\n1,1e19\n", "line 3: SEQLEN=1e+19 is too large for a size"),
        ("t,SEQLEN\n2,5\n1,5\n", "line 3: t=1 is earlier than the event before"),
        ("t,SEQLEN,mem_usage\n0,5,1.5\n", "line 2: mem_usage=1.5 is outside [0, 1]"),
        ("t,SEQ LEN\n0,5\n", "malformed column name 'SEQ LEN'"),
        ("t,SEQLEN,SEQLEN\n0,5,5\n", "duplicate column"),
        ("time,SEQLEN\n0,5\n", "no column 't'"),
        ("t,mem_usage\n0,0.5\n", "no dim column"),
        ("t,SEQLEN\n", "no events"),
        ("", "no column 't'"),
        ("t,SEQLEN\n0,5\n1,x\n", "line 3: SEQLEN='x' is not a number"),
        ("t,SEQLEN\n0,5\n1\n", "line 3: 1 value, the header has 2 (t,SEQLEN)"),
        ("t,SEQLEN\n0,5,6\n", "line 2: 3 values, the header has 2"),
        ("t,SEQLEN\n0,5,6\n1,5,6\n", "line 2: 3 values, the header has 2"),
        ("t,SEQLEN\n\n# a comment\n0,5\n\n1,0\n", "line 6: SEQLEN=0 is not a positive size"),
        ("t,SEQLEN\n0,5\n\n1,5 # late\n2,x\n", "line 5: SEQLEN='x' is not a number"),
    ],
)
def test_bad_traces_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(TraceError, match="trace.csv: .*" + re.escape(message)):
        load_trace(write(tmp_path, text))


def test_missing_trace_lists_shipped_names(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"trace not found: .*nope\.csv .*azure_code_prefill"):
        load_trace(tmp_path / "nope.csv")
