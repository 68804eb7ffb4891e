"""The public surfaces by audience: `import gearshift as gs` for a model author, the engines'
pieces at their packages (`gearshift.graphs`, `gearshift.worker`), `gearshift.controller` for
an operator; each `__all__` is exactly what a user may import, and a name that moved is
refused with a pointer to its new home, never kept as an alias."""

from __future__ import annotations

import importlib
import re
import types

import pytest

import gearshift as gs
from gearshift import controller
from gearshift.worker import interfaces

MODEL_AUTHOR = {"compile", "connect", "Dim", "group", "outside_capture"}
PIECES = {  # an engine's pieces and their packages
         "AdaptiveRunner": "gearshift.graphs", "CompiledRunner": "gearshift.graphs",
         "GraphResourcePool": "gearshift.graphs",
         "Transform": "gearshift.graphs", "Client": "gearshift.worker",
         "CompiledModel": "gearshift.worker", "Group": "gearshift.worker",
         "GroupRank": "gearshift.worker", "Maintenance": "gearshift.worker",
         "Profile": "gearshift.worker", "Route": "gearshift.worker"}


def _public(module: types.ModuleType) -> set[str]:
    return {n for n in dir(module) if not n.startswith("_")
            and not isinstance(getattr(module, n), types.ModuleType)}


def test_all_is_every_public_name_of_the_package_the_lazy_ones_too_and_each_resolves() -> None:
    """`dir(gs)` lists the lazily imported names beside the loaded ones; `getattr` imports."""
    assert _public(gs) == set(gs.__all__)
    assert len(gs.__all__) == len(set(gs.__all__))
    errors = {n for n in gs.__all__ if isinstance(getattr(gs, n), type)
              and issubclass(getattr(gs, n), gs.GearshiftError)}
    assert set(gs.__all__) == MODEL_AUTHOR | errors


@pytest.mark.parametrize("package", ["gearshift.graphs", "gearshift.worker"])
def test_each_engine_package_exports_its_pieces_lazily_and_each_resolves(package: str) -> None:
    module = importlib.import_module(package)
    assert set(module.__all__) == {n for n, home in PIECES.items() if home == package}
    assert set(module.__all__) <= set(dir(module))
    for name in module.__all__:
        assert getattr(module, name).__name__ == name


RENAMED = {"gearshift.Compiled": "gearshift.worker.CompiledModel",
           "gearshift.worker.Compiled": "gearshift.worker.CompiledModel",
           "gearshift.graphs.compiled": "gearshift.graphs.torchcompile"}


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_a_renamed_name_is_refused_with_its_new_name(old: str) -> None:
    package, _, name = old.rpartition(".")
    pointer = re.escape(f"{old} was renamed {RENAMED[old]}")
    with pytest.raises(AttributeError, match=pointer):
        getattr(importlib.import_module(package), name)
    with pytest.raises(ImportError, match=pointer):
        exec(f"from {package} import {name}", {})


@pytest.mark.parametrize("old", ["gearshift.GraphRunner", "gearshift.graphs.GraphRunner",
                                 "gearshift.graphs.runner"])
def test_the_removed_graph_runner_is_refused_with_what_does_its_work(old: str) -> None:
    package, _, name = old.rpartition(".")
    with pytest.raises(AttributeError, match=r"removed .only tests used it.*AdaptiveRunner"):
        getattr(importlib.import_module(package), name)
    with pytest.raises(ImportError, match=r"removed .only tests used it.*AdaptiveRunner"):
        exec(f"from {package} import {name}", {})


@pytest.mark.parametrize("name", sorted(set(PIECES) - {"CompiledModel"}))
def test_a_name_that_moved_is_refused_with_a_pointer_to_its_new_home(name: str) -> None:
    pointer = f"gearshift.{name} moved to {PIECES[name]}.{name}"
    with pytest.raises(AttributeError, match=re.escape(pointer)):
        getattr(gs, name)
    with pytest.raises(ImportError, match=re.escape(pointer)):
        exec(f"from gearshift import {name}", {})


POINTER = "gearshift.operator moved to gearshift.controller"


def test_the_operator_module_moved_to_the_controller_package_with_a_pointer() -> None:
    """`gearshift.operator` shadowed the standard library's `operator` in a caller's namespace
    (`from gearshift import operator`)."""
    for statement in ("from gearshift import operator", "import gearshift.operator",
                      "from gearshift.operator import PolicyConfig"):
        with pytest.raises(ImportError, match=re.escape(POINTER)):
            exec(statement, {})
    with pytest.raises(AttributeError, match=re.escape(POINTER)):
        gs.operator  # noqa: B018


def test_an_unknown_name_is_refused_as_python_refuses_it() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        gs.nothing  # noqa: B018
    with pytest.raises(ImportError, match="cannot import name 'nothing'"):
        exec("from gearshift import nothing", {})


@pytest.mark.parametrize("name", ["PolicyConfig", "load_policy_config", "ControllerRunning",
                                  "TraceError", "Plan"])
def test_operator_names_and_old_aliases_are_not_the_model_authors(name: str) -> None:
    with pytest.raises(AttributeError):
        getattr(gs, name)


def test_the_controller_package_lists_what_an_operator_imports() -> None:
    public = {n for n in vars(controller) if not n.startswith("_")
              and not isinstance(getattr(controller, n), types.ModuleType)}
    assert public == set(controller.__all__)
    assert controller.PolicyConfig().check_interval_seconds > 0
    assert controller.ConfigError is gs.ConfigError


SWAP_THREAD = ["adopt", "maintain", "forked", "measured", "tick", "refresh", "wake", "attached",
               "seen", "rebind"]  # what the client's swap thread and its profiles use of each other


@pytest.mark.parametrize("name", SWAP_THREAD)
def test_a_client_and_its_profiles_show_the_workers_api_only(namespace: str, name: str) -> None:
    """The swap thread's internals are underscored, on the objects and in the `Host` protocol
    the profile knows its client by."""
    client = gs.connect(namespace, background=False, register_timeout=0)  # no controller needed
    try:
        prof = client.profile("p", {"B": gs.Dim(max=8)})
        assert name not in dir(client) and name not in dir(prof)
        assert name not in vars(interfaces.Host)
    finally:
        client.close()
