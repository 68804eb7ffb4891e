"""docs/architecture.md repeats every shared-memory layout table of the code verbatim."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gearshift.shm import control, mailbox, ring, segment, snapshot

DOC = Path(__file__).parents[1] / "docs" / "architecture.md"


def _tables(doc: str) -> list[str]:
    """The layout tables of a module docstring: blocks whose first line starts with 'offset'."""
    lines, tables = doc.splitlines(), []
    for i, line in enumerate(lines):
        if line.strip().startswith("offset"):
            end = next((j for j in range(i, len(lines)) if not lines[j].strip()), len(lines))
            tables.append(textwrap.dedent("\n".join(lines[i:end])))
    return tables


@pytest.mark.parametrize("module", [segment, ring, snapshot, mailbox, control])
def test_the_architecture_doc_repeats_the_modules_layout_tables(module: object) -> None:
    tables = _tables(module.__doc__)
    assert tables
    text = DOC.read_text()
    for table in tables:
        assert f"```\n{table}\n```" in text
