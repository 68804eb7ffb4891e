"""The package's layers, read from the source with `ast`: imports go only downward, no circles.

Layers, lowest first (docs/architecture.md, "Layout"): a module imports its own layer's
modules and lower layers' only; the two groups of one rank (the controller and the graphs)
never import each other. The core imports nothing but itself, the errors, numpy and a few
pure standard modules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import gearshift

ROOT = Path(gearshift.__file__).parent
LAYERS = {  # group -> rank; a module's group is the longest prefix that names one
    "gearshift.errors": 0, "gearshift.clock": 0, "gearshift.clikit": 0, "gearshift.environment": 0,
    "gearshift.afterfork": 0, "gearshift.lazy": 0, "gearshift.threads": 0,
    "gearshift.core": 1,
    "gearshift.protocol": 2, "gearshift.shm": 2, "gearshift.configfile": 2, "gearshift.export": 2,
    "gearshift.controller": 3, "gearshift.graphs": 3,
    "gearshift.worker": 4,
    "gearshift": 5,  # the package itself: the public names
    "gearshift.tools": 6,
    "gearshift.cli": 7,
    "gearshift.__main__": 8,
}
CORE_MAY_IMPORT = {"__future__", "math", "bisect", "itertools", "functools", "collections",
                   "collections.abc", "dataclasses", "typing", "numpy", "gearshift.errors"}


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(module: str) -> set[str]:
    """Every module `module` imports (at any depth of its code, lazily or not)."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            submodules = {f"{base}.{a.name}" for a in node.names} & MODULES.keys()
            found |= submodules  # `from package import module` runs the package's own code
            if len(submodules) < len(node.names):  # too, but imports nothing of it
                found.add(base)
    return found


GRAPH = {m: {i for i in _imports(m) if i in MODULES and i != m} for m in MODULES}


def _group(module: str) -> str:
    return max((g for g in LAYERS if module == g or module.startswith(g + ".")), key=len)


def test_every_module_has_a_layer() -> None:
    assert all(_group(m) for m in MODULES)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_layers(module: str) -> None:
    group = _group(module)
    wrong = [i for i in sorted(GRAPH[module])
             if _group(i) != group and LAYERS[_group(i)] >= LAYERS[group]]
    assert not wrong, f"{module} (layer {LAYERS[group]}) imports {wrong}"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _group(m) == "gearshift.core"))
def test_the_core_imports_nothing_impure(module: str) -> None:
    outside = {i for i in _imports(module)
               if not i.startswith("gearshift.core") and i != "gearshift.core"}
    assert outside <= CORE_MAY_IMPORT, f"{module} imports {sorted(outside - CORE_MAY_IMPORT)}"


def test_there_is_no_import_circle() -> None:
    """Tarjan's strongly connected components of the module graph: all of size one."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(m: str) -> None:
        index[m] = low[m] = len(index)
        stack.append(m)
        for n in GRAPH[m]:
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            component = []
            while True:
                n = stack.pop()
                component.append(n)
                if n == m:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for m in MODULES:
        if m not in index:
            visit(m)
    assert not circles


def test_the_core_and_the_controller_load_no_torch_and_no_threads() -> None:
    code = ("import sys, gearshift.core.policy, gearshift.core.stats, gearshift.core.planner; "
            "impure = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'threading', 'socket', 'msgpack', 'posix_ipc') or m == 'gearshift.clock'); "
            "import gearshift.controller.controller; "
            "print(impure, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[] False"


TEST_ONLY = {"pytest", "hypothesis", "ruff"}  # only the `test` extra installs them


def _module_level_imports(path: Path) -> set[str]:
    """The top packages a module imports when it loads: outside functions and TYPE_CHECKING."""
    found: set[str] = set()

    def walk(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                found.add(node.module.split(".")[0])
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                walk(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                walk(node.body + node.orelse + node.finalbody
                     + [s for h in node.handlers for s in h.body])
            elif isinstance(node, ast.ClassDef):
                walk(node.body)

    walk(ast.parse(path.read_text()).body)
    return found


@pytest.mark.parametrize("module", sorted(MODULES))
def test_the_product_loads_no_test_only_package(module: str) -> None:
    """A test-only package is imported in the function that needs it, never as a module loads."""
    assert not _module_level_imports(MODULES[module]) & TEST_ONLY


@pytest.mark.parametrize("path", sorted((Path(__file__).parent / "core").glob("test_*.py")),
                         ids=lambda p: p.name)
def test_the_core_s_tests_stay_below_the_controller(path: Path) -> None:
    """Tests of the pure core use the core and the layers beside it (its config files), not
    the controller, the graphs, the worker or the tools (whole-trace replays, which need the
    simulator, are tests/tools')."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            used.add(node.module)
        elif isinstance(node, ast.Import):
            used.update(a.name for a in node.names)
    above = sorted(m for m in used if m.startswith("gearshift") and m in MODULES
                   and LAYERS[_group(m)] >= LAYERS["gearshift.controller"])
    assert not above, f"{path.name} imports {above}"
