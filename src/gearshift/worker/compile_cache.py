"""A node's compile cache: one directory per namespace, shared by the namespace's workers.

`prepare(namespace)` makes (mode 0700) and checks `$XDG_CACHE_HOME/gearshift/<namespace>`
(default `~/.cache/gearshift/<namespace>`) and, inside it, `inductor/` (Inductor's on-disk
caches: `TORCHINDUCTOR_CACHE_DIR` is set to it unless the environment already names one, which
is then kept; the default that importing Inductor writes there is no one's choice and is
replaced) and `locks/` (a lock file per compiled shape, `graphs.torchcompile`). Every level
from `gearshift/` down is opened without following a symlink (relative to its parent's
descriptor) and must be a directory owned by this user that no one else may write: another
user's files in it could be loaded as compiled code. Anything else raises StateError naming
the path and what to do.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from gearshift.errors import StateError
from gearshift.shm import names

CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def cache_root(namespace: str) -> Path:
    """Where the compile cache of `namespace` lives."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gearshift" / namespace


def prepare(namespace: str) -> Path:
    """Make and check the cache of `namespace`; point Inductor at it (unless the environment
    names a cache already); returns its `locks/` directory."""
    names.validate(namespace)
    root = cache_root(namespace)
    root.parent.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(root.parent.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)  # the user's
    try:
        for level in ("gearshift", namespace):
            child = _enter(fd, level, root)
            os.close(fd)
            fd = child
        for inner in ("inductor", "locks"):
            os.close(_enter(fd, inner, root))
    finally:
        os.close(fd)
    named = os.environ.get(CACHE_ENV)
    if named is None or named == _torch_default():
        os.environ[CACHE_ENV] = str(root / "inductor")
    return root / "locks"


def _torch_default() -> str | None:
    """The directory torch itself writes into the environment when Inductor is imported
    (its default, not a choice of the user's); None while Inductor is not imported."""
    utils = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    return None if utils is None else os.path.abspath(utils.default_cache_dir())


def _enter(parent: int, name: str, root: Path) -> int:
    """The descriptor of directory `name` under `parent` (made 0700 if missing), checked."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(name, 0o700, dir_fd=parent)
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as e:
        raise StateError(f"compile cache {root}: {name!r} is not a directory one may open"
                         f" without following a link ({e}); remove it") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise StateError(
            f"compile cache {root}: {name!r} is owned by uid {st.st_uid} with mode"
            f" {st.st_mode & 0o777:o}; it must be this user's ({os.geteuid()}) and writable by"
            " no one else: fix or remove it"
        )
    return fd
