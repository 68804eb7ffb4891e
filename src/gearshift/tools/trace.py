"""Request-shape traces: CSV files of timed raw sizes (format: data/traces/README.md).

Column `t` holds seconds (float, non-decreasing); every other column is one dim
named like an identifier (`SEQLEN`, `BATCHSIZE`) holding positive int sizes,
except the optional `mem_usage`: the device memory usage reading (0..1) at that
time. Blank lines and `#` comments are skipped. Any violation is a TraceError naming the file,
the line (as an editor numbers it, the header being line 1) and the column.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import numpy as np

from gearshift.errors import TraceError

MEM_COLUMN = "mem_usage"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Trace:
    """One trace in memory: `t` float64 non-decreasing; each dim int64 >= 1, same length."""

    name: str
    t: np.ndarray
    dims: dict[str, np.ndarray]
    mem_usage: np.ndarray | None = None

    @property
    def events(self) -> int:
        return len(self.t)

    @property
    def duration(self) -> float:
        return float(self.t[-1] - self.t[0])


def shipped_dir() -> Path:
    return Path(str(files("gearshift") / "data" / "traces"))


def shipped_traces() -> list[str]:
    """Names of the traces shipped with the package."""
    return sorted(p.stem for p in shipped_dir().glob("*.csv"))


def resolve(source: str | Path) -> Path:
    """A path to an existing file, or the name of a shipped trace; TraceError otherwise."""
    path = Path(source)
    if path.is_file():
        return path
    shipped = shipped_dir() / f"{source}.csv"
    if shipped.is_file():
        return shipped
    raise TraceError(
        f"trace not found: {source} (not a file, nor a shipped trace: "
        f"{', '.join(shipped_traces())})"
    )


def load_trace(source: str | Path) -> Trace:
    """Load and validate a trace CSV given by path or shipped name."""
    path = resolve(source)
    with open(path) as f:
        header = [c.strip() for c in f.readline().strip().split(",")]
        _check_header(path, header)
        try:
            with warnings.catch_warnings():  # an empty body is reported below
                warnings.simplefilter("ignore", UserWarning)
                table = np.loadtxt(f, delimiter=",", dtype=np.float64, ndmin=2, comments="#")
        except ValueError:
            table = None  # numpy's message numbers rows, not lines: find the line ourselves
    if table is None or (table.size and table.shape[1] != len(header)):
        raise _malformed(path, header)
    if table.shape[0] == 0:
        raise TraceError(f"{path}: no events")
    columns = dict(zip(header, table.T, strict=True))
    t = columns.pop("t")
    _first_bad(path, "t", ~np.isfinite(t), t, "is not a finite number")
    _first_bad(path, "t", np.r_[False, np.diff(t) < 0], t, "is earlier than the event before")
    mem = columns.pop(MEM_COLUMN, None)
    if mem is not None:
        _first_bad(path, MEM_COLUMN, ~((mem >= 0) & (mem <= 1)), mem, "is outside [0, 1]")
    dims = {}
    for name, col in columns.items():
        _first_bad(
            path, name, ~(np.isfinite(col) & (col == np.floor(col))), col, "is not an integer size"
        )
        _first_bad(path, name, col < 1, col, "is not a positive size")
        _first_bad(path, name, col >= 2.0**63, col, "is too large for a size (below 2**63)")
        dims[name] = col.astype(np.int64)
    return Trace(path.stem, t, dims, mem)


def _check_header(path: Path, header: list[str]) -> None:
    if "t" not in header:
        raise TraceError(f"{path}: no column 't' in header {','.join(header)}")
    for name in header:
        if not _NAME.match(name):
            raise TraceError(f"{path}: malformed column name {name!r} (expected an identifier)")
    if len(set(header)) != len(header):
        raise TraceError(f"{path}: duplicate column in header {','.join(header)}")
    if not set(header) - {"t", MEM_COLUMN}:
        raise TraceError(f"{path}: no dim column, only {','.join(header)}")


def _data_lines(path: Path) -> list[tuple[int, list[str]]]:
    """(line number, fields) of every data line: after the header, without blank lines and
    comments, as `np.loadtxt` reads them."""
    with open(path) as f:
        lines = list(enumerate(f, 1))[1:]
    stripped = ((n, line.split("#", 1)[0].strip()) for n, line in lines)
    return [(n, [v.strip() for v in text.split(",")]) for n, text in stripped if text]


def _malformed(path: Path, header: list[str]) -> TraceError:
    """The first data line with another number of values than the header, or a value that is
    not a number."""
    for n, values in _data_lines(path):
        if len(values) != len(header):
            return TraceError(
                f"{path}: line {n}: {len(values)} value{'s' * (len(values) != 1)}, the header "
                f"has {len(header)} "
                f"({','.join(header)})"
            )
        for column, value in zip(header, values, strict=True):
            try:
                float(value)
            except ValueError:
                return TraceError(f"{path}: line {n}: {column}={value!r} is not a number")
    return TraceError(f"{path}: malformed data")


def _first_bad(path: Path, column: str, bad: np.ndarray, col: np.ndarray, what: str) -> None:
    if bad.any():
        i = int(np.argmax(bad))
        line = _data_lines(path)[i][0]
        raise TraceError(f"{path}: line {line}: {column}={col[i]:g} {what}")
