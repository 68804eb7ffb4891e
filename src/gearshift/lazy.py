"""A package's public names, imported on first use (PEP 562), and the names that left it,
refused with a pointer to where they are now; none is kept as an alias.

`exports(package, lazy, moved)` gives the package's `__getattr__` and `__dir__`: `lazy` maps
each public name to the module defining it (so that `import gearshift` stays light and
torch-free); `moved` maps each old name to the sentence saying where it went, raised as
AttributeError by `package.NAME`. `from package import NAME` and `import package.NAME` would
turn that AttributeError into a bare "cannot import name" (Python first tries `package.NAME`
as a submodule): a finder at the end of `sys.meta_path` (`Moved`, consulted only after the
real finders found no such module) raises the same sentence as ImportError there.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Mapping, Sequence


class Moved(importlib.abc.MetaPathFinder):
    """Refuses importing `package.NAME` for each moved NAME, with its pointer."""

    def __init__(self, package: str, moved: Mapping[str, str]) -> None:
        self.package = package
        self.pointers = {f"{package}.{name}": why for name, why in moved.items()}

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if fullname in self.pointers:
            raise ImportError(self.pointers[fullname], name=fullname)
        return None


def exports(package: str, lazy: Mapping[str, str], moved: Mapping[str, str] | None = None,
            ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package` (see the module's docstring)."""
    moved = dict(moved or {})
    if moved:
        sys.meta_path[:] = [f for f in sys.meta_path
                            if not (isinstance(f, Moved) and f.package == package)]
        sys.meta_path.append(Moved(package, moved))

    def __getattr__(name: str) -> object:
        if name in lazy:
            return getattr(importlib.import_module(lazy[name]), name)
        if name in moved:
            raise AttributeError(moved[name])
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *lazy})

    return __getattr__, __dir__


def moved_to(package: str, names: Sequence[str], home: str) -> dict[str, str]:
    """`moved` entries for `names` that moved from `package` to `home` under the same name."""
    return {n: f"{package}.{n} moved to {home}.{n}" for n in names}
