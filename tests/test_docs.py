"""The docs hold together: each shared-memory layout table lives once, in its module's docstring
(tests/shm checks it against the constants), and docs/architecture.md links to the module instead
of copying it; every relative link, #anchor and quoted section name between the docs resolves."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from gearshift.shm import control, mailbox, ring, segment, snapshot, streams

ROOT = Path(__file__).parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
QUOTED = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)\s]*)?\),? \"([^\"]+)\"")


def _tables(doc: str) -> list[str]:
    """The layout tables of a module docstring: blocks whose first line starts with 'offset'."""
    lines, tables = doc.splitlines(), []
    for i, line in enumerate(lines):
        if line.strip().startswith("offset"):
            end = next((j for j in range(i, len(lines)) if not lines[j].strip()), len(lines))
            tables.append(textwrap.dedent("\n".join(lines[i:end])))
    return tables


def _headings(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.DOTALL)
    return [m.group(1).strip() for m in re.finditer(r"^#+ (.+)$", text, re.MULTILINE)]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


@pytest.mark.parametrize("module", [segment, ring, snapshot, mailbox, control, streams])
def test_the_architecture_doc_links_each_layout_module_instead_of_copying_its_tables(
    module: object,
) -> None:
    tables = _tables(module.__doc__)
    assert tables  # the one place the layout lives
    text = (ROOT / "docs" / "architecture.md").read_text()
    path = Path(module.__file__).relative_to(ROOT / "src" / "gearshift").as_posix()
    assert f"](../src/gearshift/{path})" in text
    for table in tables:
        assert table.splitlines()[1] not in text  # its first row: no copy to drift


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_relative_link_and_anchor_resolves(doc: Path) -> None:
    text = re.sub(r"```.*?```", "", doc.read_text(), flags=re.DOTALL)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked here
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        assert file.exists(), f"{doc.name}: {target}"
        if anchor:
            anchors = {_anchor(h) for h in _headings(file)}
            assert anchor in anchors, f"{doc.name}: {target}"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_section_named_after_a_link_exists(doc: Path) -> None:
    """`[docs/x.md](x.md), "Some section"`: x.md has a heading that starts with that name."""
    text = " ".join(doc.read_text().split())
    for path, name in QUOTED.findall(text):
        file = (doc.parent / path).resolve()
        headings = [h.replace("`", "") for h in _headings(file)]
        assert any(h.startswith(name.replace("`", "")) for h in headings), f"{doc.name}: {name}"
