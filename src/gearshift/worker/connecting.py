"""`connect()`: a worker's client of its namespace's controller, which may start before or
after the worker, or run embedded in it.

By default the client needs no controller yet (see `Client`: it serves on its profiles'
initial gears and attaches when one has created the namespace); `require_controller=True`
raises ControllerNotFound, saying how to start one, when none is alive; `embedded=True` starts
one in a daemon thread of this process when none is alive, with its state file in `state_dir`
(else `GEARSHIFT_STATE_DIR`) or, by default, in a temporary directory removed when it stops
(nothing kept across runs). The namespace is the argument, else `GEARSHIFT_NAMESPACE`, else
"default" (`names.resolve`, as the command line resolves it).
"""

from __future__ import annotations

from gearshift.clock import Clock
from gearshift.errors import ControllerNotFound
from gearshift.shm import Registry, names
from gearshift.worker.attaching import NO_CONTROLLER
from gearshift.worker.session import Client, MemoryReader


def connect(
    namespace: str | None = None,
    device: int = 0,
    *,
    embedded: bool = False,
    require_controller: bool = False,
    state_dir: str | None = None,
    clock: Clock | None = None,
    memory: MemoryReader | None = None,
    register_timeout: float = 2.0,
    background: bool = True,
) -> Client:
    """A client of the controller serving `namespace` (None: `GEARSHIFT_NAMESPACE`, else
    "default"), for accelerator `device`; see Client.

    Without a live controller the client serves on its profiles' initial gears (or on the last
    snapshot a dead controller left) and attaches when one starts; `require_controller=True`
    raises ControllerNotFound instead; `embedded=True` starts one in this process, whose state
    file is kept in `state_dir` (None: `GEARSHIFT_STATE_DIR`, else a temporary directory removed
    at close). The npu backends of the process count their streams in the namespace's
    stream ledgers until the client closes (`graphs.streams`)."""
    namespace = names.resolve(namespace)
    controller = None
    registry: Registry | str = namespace
    if embedded or require_controller:
        try:
            registry = _attach_live(namespace)
        except ControllerNotFound:
            if not embedded:
                raise
            from gearshift.controller.embedded import start_default

            controller = start_default(namespace, state_dir)
            registry = Registry.attach(namespace)
    try:
        return Client(
            registry,
            device,
            clock=clock,
            memory=memory,
            controller=controller,
            register_timeout=register_timeout,
            background=background,
        )
    except BaseException:
        if isinstance(registry, Registry):
            registry.close()
        if controller is not None:
            controller.stop()
        raise


def _attach_live(namespace: str) -> Registry:
    try:
        registry = Registry.attach(namespace)
    except ControllerNotFound:
        raise ControllerNotFound(NO_CONTROLLER % (namespace, namespace)) from None
    if not registry.controller().alive:
        registry.close()
        raise ControllerNotFound(NO_CONTROLLER % (namespace, namespace))
    return registry
