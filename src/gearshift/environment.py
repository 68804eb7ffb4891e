"""The `GEARSHIFT_*` environment variables: the one module that reads them.

Each stands for the configuration key it names (`GEARSHIFT_NAMESPACE`: `namespace`); an unset
or empty variable is absent. A value given explicitly (an argument, a command-line option)
wins over the variable, the variable over the default; `gearshift serve`'s whole order is
flag > `--set` > variable > file (`controller.config.load_configs`). Of these keys a worker
(`gs.connect`) reads `namespace`, and `state_dir` for an embedded controller; the others are
the sidecar's (`GEARSHIFT_CONFIG` and `GEARSHIFT_LOG_LEVEL` are the command line's own).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

VARIABLES = {  # key -> variable
    "namespace": "GEARSHIFT_NAMESPACE",
    "state_dir": "GEARSHIFT_STATE_DIR",
    "metrics_port": "GEARSHIFT_METRICS_PORT",
    "metrics_addr": "GEARSHIFT_METRICS_ADDR",
    "fleet_url": "GEARSHIFT_FLEET_URL",
}
DEFAULT_NAMESPACE = "default"


def read(key: str) -> str | None:
    """The value of `key`'s variable, or None if it is unset or empty."""
    return os.environ.get(VARIABLES[key]) or None


def given(keys: Iterable[str]) -> dict[str, str]:
    """The raw values of those of `keys` that have a variable, and whose variable is set."""
    return {k: v for k in keys if k in VARIABLES and (v := read(k)) is not None}
