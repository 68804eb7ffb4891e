"""`gearshift bench fuzz`: its table in the report says which boundaries failed."""

from __future__ import annotations

from gearshift.tools.bench.tables import TABLES
from gearshift.tools.stress.target import Tally


def _result(**failures: int) -> dict[str, int]:
    clean, hit = Tally(cases=10, refused=4), Tally(cases=7, **failures)
    return {f"{name}.{k}": v for name, t in (("ring header", clean), ("state file", hit))
            for k, v in t.figures().items()}


def test_a_boundary_with_a_failure_is_marked_failed_and_the_others_clean() -> None:
    rows = TABLES["fuzz"](_result(crashes=1))
    assert [(r[0], r[3]) for r in rows] == [("ring header", "clean"), ("state file", "FAILED")]
    assert rows[0][1] == "10 cases, 4 refused" and "crashes 1" in rows[1][2]


def test_interrupted_steps_alone_are_no_failure() -> None:
    assert [r[3] for r in TABLES["fuzz"](_result(interrupted=3))] == ["clean", "clean"]
