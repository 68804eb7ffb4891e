"""Request-shape traces: CSV files of timed raw sizes (format: data/traces/README.md).

Column `t` holds seconds (float, non-decreasing); every other column is one dim
named like an identifier (`SEQLEN`, `BATCHSIZE`) holding positive int sizes,
except the optional `mem_usage`: the device memory usage reading (0..1) at that
time. Any violation is a TraceError naming the file, column and line.
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
                table = np.loadtxt(f, delimiter=",", dtype=np.float64, ndmin=2)
        except ValueError as e:
            raise TraceError(f"{path}: malformed data: {e}") from None
    if table.shape[0] == 0:
        raise TraceError(f"{path}: no events")
    if table.shape[1] != len(header):
        raise TraceError(f"{path}: {table.shape[1]} values per row, header has {len(header)}")
    columns = dict(zip(header, table.T, strict=True))
    t = columns.pop("t")
    _first_bad(path, "t", ~np.isfinite(t), t, "is not a finite number")
    _first_bad(path, "t", np.r_[False, np.diff(t) < 0], t, "is earlier than the row before")
    mem = columns.pop(MEM_COLUMN, None)
    if mem is not None:
        _first_bad(path, MEM_COLUMN, ~((mem >= 0) & (mem <= 1)), mem, "is outside [0, 1]")
    dims = {}
    for name, col in columns.items():
        _first_bad(
            path, name, ~(np.isfinite(col) & (col == np.floor(col))), col, "is not an integer size"
        )
        _first_bad(path, name, col < 1, col, "is not a positive size")
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


def _first_bad(path: Path, column: str, bad: np.ndarray, col: np.ndarray, what: str) -> None:
    if bad.any():
        i = int(np.argmax(bad))
        raise TraceError(f"{path}: line {i + 2}: {column}={col[i]:g} {what}")
