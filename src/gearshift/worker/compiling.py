"""`gs.compile`: a function or module on adaptive, compiled gears in one call.

`compile(fn, dims, inputs)` connects to the namespace of the environment (`GEARSHIFT_NAMESPACE`,
else `default`), makes a profile (named after `fn` unless `name=`) and returns a `CompiledModel`:
call it as `fn` (positional arguments bind to `inputs` in their order, keywords by name). Its
first call gives the example (static sizes and dtypes) unless `example=` did, and attaches a
`CompiledRunner` (`graphs.torchcompile`: each gear combination its own static-shape compile,
made by the client's swap thread, never on the request path), its compiles shared by the
namespace's workers on the node through one cache (`worker.compile_cache`).

The compiles of one process share one client per (namespace, device, embedded), counted: the
last `CompiledModel.close()` of a client closes it (a client passed as `client=` is the caller's,
never closed here).

A profile belongs to one function (`Names`): on one client, a second, different function (a
draft and a target model of one class) gets a profile of its own, named after its class with a
suffix (`LlamaForCausalLM.2`, `.3`, ... in the order of the calls, so that workers making them
in the same order share them and `gearshift status` tells them apart), logged; an explicit
`name=` that another function holds is refused (ConfigError), since the caller chose it. One
function compiled twice shares its profile. A name is free again once its last `CompiledModel` is
closed. Why not refuse both: the twin case is the ordinary one (speculative decoding), and a
derived name was never the caller's choice.
"""

from __future__ import annotations

import atexit
import functools
import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from gearshift.core.dims import Dim
from gearshift.core.group import Group
from gearshift.errors import ConfigError, ShapeError
from gearshift.shm import names
from gearshift.worker import compile_cache
from gearshift.worker.connecting import connect
from gearshift.worker.interfaces import Runner
from gearshift.worker.profile import Profile
from gearshift.worker.session import Client

log = logging.getLogger(__name__)
_shared: dict[tuple[str, int, bool], tuple[Client, int]] = {}  # client and its users
_shared_lock = threading.Lock()
MAX_TWINS = 64  # suffixes tried for a derived profile name


class Names:
    """Which function holds each profile name of one client (and how many `CompiledModel` use it):
    a profile belongs to one function."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[Callable[..., Any], int]] = {}
        self._lock = threading.Lock()

    def claim(self, fn: Callable[..., Any], name: str | None) -> str:
        """The profile name of `fn`: `name` (ConfigError if another function holds it), else
        its `__name__` or class, suffixed `.2`, `.3`, ... past those other functions hold."""
        with self._lock:
            if name is not None:
                held = self._held.get(name)
                if held is not None and held[0] is not fn:
                    raise ConfigError("name", f"profile {name!r} already runs {held[0]!r} in"
                                      f" this process; a profile belongs to one function:"
                                      f" give {fn!r} a name of its own (name=...)")
                return self._take(fn, name)
            base = getattr(fn, "__name__", None) or type(fn).__name__
            for n in range(1, MAX_TWINS + 1):
                candidate = base if n == 1 else f"{base}.{n}"
                held = self._held.get(candidate)
                if held is None or held[0] is fn:
                    if n > 1 and held is None:
                        log.info("profile %r runs another %s in this process: this one is"
                                 " profile %r (pass name= to name it)", base, base, candidate)
                    return self._take(fn, candidate)
            raise ConfigError("name", f"{MAX_TWINS} functions named {base!r} on one client:"
                              f" pass name= to each")

    def _take(self, fn: Callable[..., Any], name: str) -> str:
        held = self._held.get(name)
        self._held[name] = (fn, 1 + (held[1] if held else 0))
        return name

    def release(self, name: str) -> None:
        """One user of `name` is done; the last frees it."""
        with self._lock:
            fn, users = self._held.get(name, (None, 0))
            if users > 1:
                self._held[name] = (fn, users - 1)
            else:
                self._held.pop(name, None)


_names: weakref.WeakKeyDictionary[Client, Names] = weakref.WeakKeyDictionary()


class CompiledModel:
    """`fn` on the adaptive gears of `profile` (of `client`): call it as `fn`. `runner` is
    None until the first call (or an `example`) attaches it. `close()` lets go of the
    client."""

    def __init__(self, client: Client, profile: Profile, fn: Callable[..., Any],
                 inputs: Mapping[str, tuple[str | None, ...]], options: Mapping[str, Any],
                 release: Callable[[], None]) -> None:
        self.client, self.profile, self.fn, self.inputs = client, profile, fn, dict(inputs)
        self.runner: Runner | None = None
        self._options, self._release = dict(options), release
        self._names = tuple(self.inputs)
        self._lock = threading.Lock()
        atexit.register(self.close)  # before the client's own (atexit runs last first)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) > len(self._names):
            raise ShapeError(f"{self.profile.name}: {len(args)} positional inputs, expected at"
                             f" most {len(self._names)} {list(self._names)}")
        tensors = dict(zip(self._names, args, strict=False))
        if kwargs:  # positional only (a model's usual call): nothing to merge
            if twice := tensors.keys() & kwargs.keys():
                raise ShapeError(f"{self.profile.name}: inputs {sorted(twice)} given twice")
            tensors.update(kwargs)
        if self.runner is None:
            self.attach(tensors)
        return self.profile.run(**tensors)

    def attach(self, example: Mapping[str, Any]) -> Runner:
        """Attach the compiled runner, `example` giving static sizes and dtypes (once)."""
        with self._lock:
            if self.runner is None:
                self.runner = self.profile.compile(self.fn, self.inputs, example,
                                                   **self._options)
            return self.runner

    def close(self) -> None:
        """Stop compiling (waiting for a compile under way: `CompiledRunner.close`) and let go
        of the client (the last user of a shared one closes it). Idempotent; also at exit."""
        atexit.unregister(self.close)
        with self._lock:
            runner = self.runner
        close = getattr(runner, "close", None)
        if close is not None:
            close()
        release, self._release = self._release, _nothing
        release()


def compile(
    fn: Callable[..., Any],
    dims: Mapping[str, Dim],
    inputs: Mapping[str, tuple[str | None, ...]],
    example: Mapping[str, Any] | None = None,
    *,
    name: str | None = None,
    mode: str | None = None,
    options: Mapping[str, Any] | None = None,
    backend: Any = "inductor",
    client: Client | None = None,
    namespace: str | None = None,
    device: int = 0,
    embedded: bool = False,
    lazy_start: bool = True,
    group: Group | None = None,
    shared_cache: bool = True,
    **transform_options: Any,
) -> CompiledModel:
    """`fn` (a function or module) on adaptive gears of `dims`, each gear combination a
    static-shape `torch.compile(fn, dynamic=False, mode=, options=, backend=)`. `inputs` binds
    each input's axes to symbols (`{"x": ("S", None)}`: x's axis 0 is on `SEQLEN`, its axis 1
    static), as `Profile.runner`'s do: a symbol is a dim's own name, or `B` / `S`, short for
    `BATCHSIZE` / `SEQLEN` when the profile has that dim (`graphs.transform.DEFAULT_SYMBOLS`;
    `symbols=` replaces that map; `transform_options`: `symbols=`, `outputs=`, `lengths=`);
    `example` (default: the first call's tensors) gives static sizes and dtypes. The client is
    `client`, else a shared one of `namespace` (default: `GEARSHIFT_NAMESPACE`, else
    `default`) and accelerator `device` (`embedded`: see `connect`). `shared_cache`: the
    namespace's compile cache on this node (`worker.compile_cache`), with per-shape locks.
    The profile is `name`, else fn's `__name__` or class, suffixed when another function on
    the client holds it (`Names`). `group`: the rank of a group its profile is (`gs.group`)."""
    options = {"mode": mode, "options": options, "backend": backend, **transform_options}
    release = _nothing
    if client is None:
        client, release = _share(names.resolve(namespace), device, embedded)
    try:
        if shared_cache:
            options["lock_dir"] = str(compile_cache.prepare(client.namespace))
        with _shared_lock:
            names_of = _names.setdefault(client, Names())
        profile_name = names_of.claim(fn, name)
        release = _both(functools.partial(names_of.release, profile_name), release)
        profile = client.profile(profile_name, dims, lazy_start=lazy_start, group=group)
        compiled = CompiledModel(client, profile, fn, inputs, options, release)
        if example is not None:
            compiled.attach(example)
    except BaseException:
        release()
        raise
    return compiled


def _share(namespace: str, device: int, embedded: bool) -> tuple[Client, Callable[[], None]]:
    key = (namespace, device, embedded)
    with _shared_lock:
        client, users = _shared.get(key, (None, 0))
        if client is None:
            client, users = connect(namespace, device, embedded=embedded), 0
        _shared[key] = (client, users + 1)

    def release() -> None:
        with _shared_lock:
            held, left = _shared[key]
            if left > 1:
                _shared[key] = (held, left - 1)
                return
            del _shared[key]
        held.close()

    return client, release


def _both(first: Callable[[], None], then: Callable[[], None]) -> Callable[[], None]:
    def both() -> None:
        try:
            first()
        finally:
            then()

    return both


def _nothing() -> None:
    pass
