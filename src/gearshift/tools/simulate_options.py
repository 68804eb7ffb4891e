"""`gearshift simulate`'s options read into what the replay takes: DIM=VALUE lists, the device
of --capture-seconds and --workers, graph and buffer bytes, --graph-budget; a bad value is a
ConfigError naming its option."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from gearshift.core.config import MAX_BYTES, PolicyConfig, check_value
from gearshift.core.costs import MAX_GRAPH_BYTES, MAX_MEASURED_SECONDS, Line
from gearshift.core.dims import Gears, normalize_gears
from gearshift.errors import ConfigError
from gearshift.tools.simulated_device import Device
from gearshift.tools.trace import Trace


def pairs(option: str, items: Iterable[str]) -> Iterable[tuple[str, str]]:
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ConfigError(option, f"expected DIM=VALUE, got {item!r}")
        yield name.strip(), value.strip()


def gears(items: Iterable[str]) -> dict[str, Gears]:
    out = {}
    for name, value in pairs("--gears", items):
        try:
            out[name] = normalize_gears([int(v) for v in value.split(",")])
        except ValueError:
            raise ConfigError(
                "--gears", f"expected DIM=G1,G2,... of positive ints, got {name}={value}"
            ) from None
    return out


def counts(items: Iterable[str], trace: Trace) -> dict[str, int]:
    out = {}
    for item in items:
        given = pairs("--k", [item]) if "=" in item else ((d, item) for d in trace.dims)
        for name, value in given:
            if not value.isdigit() or int(value) < 1:
                raise ConfigError("--k", f"expected a positive int, got {item!r}")
            out[name] = int(value)
    return out


def costs(items: Iterable[str]) -> dict[str, tuple[float, ...]]:
    out = {}
    for name, value in pairs("--cost", items):
        try:
            out[name] = tuple(float(c) for c in value.split(","))
        except ValueError:
            raise ConfigError(
                "--cost", f"expected DIM=C0,C1,... numbers, got {name}={value}"
            ) from None
    return out


def device(capture: str | None, workers: int, priced: bool, lazy: bool) -> Device:
    """The device of --capture-seconds and --workers (captures free without them)."""
    if capture is None:
        return Device(workers=workers)
    try:
        a, b = ([float(x) for x in capture.split(",")] + [0.0])[:2]
        if capture.count(",") > 1:
            raise ValueError(capture)
        line = Line(a, b)
    except ValueError:
        raise ConfigError("--capture-seconds", f"expected A or A,B seconds, got {capture!r}") \
            from None
    for key, value in (("A", a), ("B", b)):
        check_value(f"--capture-seconds {key}", value, 0.0, MAX_MEASURED_SECONDS)
    return Device(line, workers, priced=priced, lazy=lazy)


def graph_lines(items: Iterable[str], trace: Trace, option: str = "--graph-bytes"
           ) -> dict[str, Line]:
    out = {}
    for name, value in pairs(option, items):
        if name not in trace.dims:
            raise ConfigError(option, f"unknown dim {name} (the trace has "
                                      f"{', '.join(trace.dims)})")
        try:
            a, b = ([float(x) for x in value.split(",")] + [0.0])[:2]
            if value.count(",") > 1:
                raise ValueError(value)
        except ValueError:
            raise ConfigError(option, f"expected DIM=A or DIM=A,B bytes, got "
                                      f"{name}={value}") from None
        for key, x in (("A", a), ("B", b)):
            check_value(f"{option} {key}", x, 0.0, float(MAX_GRAPH_BYTES))
        out[name] = Line(a, b)
    return out


def device_memory(given: float | None) -> float | None:
    if given is not None:
        check_value("--device-memory", given, 0.0, MAX_BYTES, low_open=True)
    return given


def budget(config: PolicyConfig, given: str | None) -> PolicyConfig:
    """`config` under --graph-budget: BYTES, RATIOx or none (None: as configured)."""
    if given is None:
        return config
    text = given.strip().lower()
    try:
        if text == "none":
            return dataclasses.replace(config, graph_memory_budget_bytes=None,
                                       graph_memory_budget_ratio=None)
        if text.endswith("x"):
            return dataclasses.replace(config, graph_memory_budget_bytes=None,
                                       graph_memory_budget_ratio=float(text[:-1]))
        return dataclasses.replace(config, graph_memory_budget_bytes=float(text))
    except ValueError:
        raise ConfigError("--graph-budget", f"expected BYTES, RATIOx or none, got {given!r}") \
            from None


def splittable(items: Iterable[str]) -> dict[str, bool]:
    choices = {"yes": True, "no": False}
    out = {}
    for name, value in pairs("--splittable", items):
        if value.lower() not in choices:
            raise ConfigError("--splittable", f"expected DIM=yes|no, got {name}={value}")
        out[name] = choices[value.lower()]
    return out
