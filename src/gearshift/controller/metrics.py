"""Prometheus metrics of the controller, read from its last status document at scrape time.

Nothing is updated on the loop's path: each scrape turns the document (published every status
interval) into metric families. prometheus_client is imported here only (the `metrics` extra).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from gearshift.errors import ConfigError


def serve_metrics(port: int, source: Callable[[], dict[str, Any] | None]) -> Callable[[], None]:
    """Serve /metrics on `port` from `source()`'s status document; returns the stop function."""
    try:
        from prometheus_client import CollectorRegistry, start_http_server
    except ImportError:
        raise ConfigError(
            "metrics_port", "metrics need prometheus_client: pip install 'gearshift[metrics]'"
        ) from None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(source))
    server, thread = start_http_server(port, registry=registry)

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return stop


class _Collector:
    def __init__(self, source: Callable[[], dict[str, Any] | None]) -> None:
        self.source = source

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            SummaryMetricFamily,
        )

        doc = self.source()
        if doc is None:
            return
        worker = ["slot", "pid", "device"]
        consumed = CounterMetricFamily(
            "gearshift_events_consumed", "Ring records drained, per worker", labels=worker
        )
        dropped = CounterMetricFamily(
            "gearshift_events_dropped", "Events dropped on a full ring, per worker", labels=worker
        )
        for w in doc["workers"]:
            labels = [str(w["slot"]), str(w["pid"]), str(w["device"])]
            consumed.add_metric(labels, w["consumed"])
            dropped.add_metric(labels, w["dropped"])
        rejected = CounterMetricFamily(
            "gearshift_events_rejected",
            "Samples not folded (unknown profile id, invalid values)",
            labels=["reason"],
        )
        for reason in ("unknown", "invalid"):
            rejected.add_metric([reason], doc["events"][reason])
        reclaimed = CounterMetricFamily(
            "gearshift_workers_reclaimed", "Dead workers whose slot was reclaimed"
        )
        reclaimed.add_metric([], doc["events"]["reclaimed_workers"])
        rounds = SummaryMetricFamily(
            "gearshift_decision_round_seconds",
            "Duration of the decision rounds (all profiles of a device)",
        )
        rounds.add_metric([], doc["rounds"]["count"], doc["rounds"]["seconds_sum"])
        version = GaugeMetricFamily(
            "gearshift_snapshot_version", "Snapshot version published", labels=["device"]
        )
        lag = SummaryMetricFamily(
            "gearshift_propagation_lag_seconds",
            "Publish until every live worker of the device applied it",
            labels=["device"],
        )
        dim = ["device", "profile", "dim"]
        gears = GaugeMetricFamily("gearshift_gears", "Gear count", labels=dim)
        padding = GaugeMetricFamily(
            "gearshift_padding_ratio", "Decayed mean pad ratio of the requests", labels=dim
        )
        for dev in doc["devices"]:
            device = str(dev["device"])
            version.add_metric([device], dev["version"])
            lag.add_metric([device], dev["lag"]["count"], dev["lag"]["seconds_sum"])
            for p in dev["profiles"]:
                for d in p["dims"]:
                    gears.add_metric([device, p["name"], d["name"]], len(d["gears"]))
                    padding.add_metric([device, p["name"], d["name"]], d["padding"])
        yield from (consumed, dropped, rejected, reclaimed, rounds, version, lag, gears, padding)
