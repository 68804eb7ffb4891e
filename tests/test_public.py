"""The two public surfaces: `import gearshift as gs` for a worker, `gearshift.operator` for an
operator; each `__all__` is exactly what a user may import."""

from __future__ import annotations

import types

import pytest

import gearshift as gs
from gearshift import operator
from gearshift.worker import interfaces


def test_all_is_every_public_name_of_the_package_the_lazy_ones_too_and_each_resolves() -> None:
    """`dir(gs)` lists the lazily imported names beside the loaded ones; `getattr` imports."""
    public = {n for n in dir(gs) if not n.startswith("_")
              and not isinstance(getattr(gs, n), types.ModuleType)}
    assert public == set(gs.__all__)
    assert len(gs.__all__) == len(set(gs.__all__))
    assert {"connect", "Client", "Profile", "Route", "compile", "AdaptiveRunner"} <= public


@pytest.mark.parametrize("name", ["PolicyConfig", "load_policy_config", "ControllerRunning",
                                  "TraceError", "Plan"])
def test_operator_names_and_old_aliases_are_not_the_workers(name: str) -> None:
    with pytest.raises(AttributeError):
        getattr(gs, name)


def test_the_operator_module_lists_what_it_holds() -> None:
    public = {n for n in vars(operator) if not n.startswith("_")}
    assert public == set(operator.__all__)
    assert operator.PolicyConfig().check_interval_seconds > 0
    assert operator.ConfigError is gs.ConfigError


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
