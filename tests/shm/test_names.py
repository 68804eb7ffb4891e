from __future__ import annotations

import pytest

from gearshift.errors import NamespaceError
from gearshift.shm import names


@pytest.mark.parametrize("namespace", ["default", "a", "A-b_c.9", "x" * names.MAX_NAMESPACE])
def test_valid_namespaces_are_accepted(namespace: str) -> None:
    assert names.validate(namespace) == namespace
    assert names.control(namespace) == f"/gearshift.{namespace}.ctl"


@pytest.mark.parametrize(
    "namespace", ["", "a/b", "/a", "a b", "ns\n", "é", "x" * (names.MAX_NAMESPACE + 1), None, 3]
)
def test_invalid_namespaces_are_refused_with_a_clear_error(namespace: object) -> None:
    with pytest.raises(NamespaceError, match="invalid namespace"):
        names.validate(namespace)  # type: ignore[arg-type]


def test_every_object_name_derives_from_the_namespace() -> None:
    assert names.lock("ns") == "/gearshift.ns.lock"
    assert names.ring("ns", 3) == "/gearshift.ns.ring.3"
    assert names.snapshot("ns", 0) == "/gearshift.ns.snap.0"
    assert names.status("ns") == "/gearshift.ns.status"


@pytest.mark.parametrize("index", [-1, 1.5, "2"])
def test_indices_must_be_non_negative_ints(index: object) -> None:
    with pytest.raises(NamespaceError):
        names.ring("ns", index)  # type: ignore[arg-type]


def test_segment_pattern_matches_only_its_own_namespace() -> None:
    own = [
        n.lstrip("/")
        for n in (
            names.control("a"),
            names.ring("a", 12),
            names.snapshot("a", 0),
            names.status("a"),
        )
    ]
    others = [
        n.lstrip("/")
        for ns in ("a.ring", "a.snap", "a.status", "a.b", "ab", "b")
        for n in (names.control(ns), names.ring(ns, 1), names.snapshot(ns, 1), names.status(ns))
    ]
    pattern = names.segment_pattern("a")
    assert all(pattern.fullmatch(n) for n in own)
    assert not any(pattern.fullmatch(n) for n in others)


@pytest.mark.parametrize("namespace", [".", ".."])
def test_dot_names_are_refused_they_would_name_a_parent_state_directory(namespace: str) -> None:
    with pytest.raises(NamespaceError, match=r"other than '\.' and '\.\.'"):
        names.validate(namespace)
    assert names.validate("...") == "..."  # a name, not a path step


def test_resolve_takes_the_argument_then_the_variable_then_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GEARSHIFT_NAMESPACE", raising=False)
    assert names.resolve() == "default"
    monkeypatch.setenv("GEARSHIFT_NAMESPACE", "llm")
    assert names.resolve() == "llm" and names.resolve("mine") == "mine"
    monkeypatch.setenv("GEARSHIFT_NAMESPACE", "a/b")
    with pytest.raises(NamespaceError, match="GEARSHIFT_NAMESPACE: invalid namespace"):
        names.resolve()
    with pytest.raises(NamespaceError, match="invalid namespace ''"):
        names.resolve("")  # given, even empty: never silently the default
