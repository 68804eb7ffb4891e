"""Prometheus metrics of the controller, read from its last status document at scrape time.

Nothing is updated on the loop's path: each scrape turns the document (published every status
interval) into metric families. prometheus_client is imported here only (the `metrics` extra).
The endpoint listens on `metrics_addr` (ControllerConfig's default: this host only) and
`metrics_port`; `check_endpoint` tells, before anything else starts, whether it can.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterator
from typing import Any

from gearshift.errors import ConfigError

log = logging.getLogger(__name__)


def check_endpoint(addr: str, port: int) -> None:
    """ConfigError (key metrics_port) unless metrics can be served on `addr`:`port` now: the
    extra is installed and the address can be bound (bound and closed at once)."""
    _client()
    try:
        family, kind, proto, _, where = socket.getaddrinfo(
            addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server does
            probe.bind(where)
    except OSError as e:
        raise _unavailable(addr, port, e) from None


def serve_metrics(
    port: int, source: Callable[[], dict[str, Any] | None], addr: str
) -> Callable[[], None]:
    """Serve /metrics on `addr`:`port` from `source()`'s status document; returns the stop
    function. ConfigError (key metrics_port) without the extra or when the port is taken."""
    client = _client()
    registry = client.CollectorRegistry(auto_describe=False)
    registry.register(_Collector(source))
    try:
        server, thread = client.start_http_server(port, addr=addr, registry=registry)
    except OSError as e:
        raise _unavailable(addr, port, e) from None
    host = f"[{addr}]" if ":" in addr else addr
    log.info("metrics served at http://%s:%d/metrics", host, server.server_address[1])

    def stop() -> None:
        server.shutdown()
        server.server_close()
        thread.join()

    return stop


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError:
        raise ConfigError(
            "metrics_port", "metrics need prometheus_client: pip install 'gearshift[metrics]'"
        ) from None
    return prometheus_client


def _unavailable(addr: str, port: int, error: OSError) -> ConfigError:
    reason = error.strerror or str(error)
    return ConfigError(
        "metrics_port",
        f"cannot serve metrics on {addr}:{port}: {reason} (choose another --metrics-port, "
        "or --metrics-addr)",
    )


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
        exited = CounterMetricFamily(
            "gearshift_workers_exited", "Workers that released their slot (closed cleanly)"
        )
        exited.add_metric([], doc["events"].get("exited_workers", 0))
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
        measured = CounterMetricFamily(
            "gearshift_measurements", "Graph measurements kept (records of the workers)"
        )
        measured.add_metric([], doc["events"].get("measured", 0))
        costs = _CostFamilies(GaugeMetricFamily, dim)
        held = GaugeMetricFamily("gearshift_graph_bytes", "Bytes the priced graphs of the "
                                 "device hold, and their static buffers, on all its workers",
                                 labels=["device"])
        buffers = GaugeMetricFamily("gearshift_graph_buffer_bytes", "The static input buffers' "
                                    "part of gearshift_graph_bytes", labels=["device"])
        bound = GaugeMetricFamily("gearshift_graph_bytes_bound", "The device's graph memory "
                                  "bound (absent: none)", labels=["device"])
        for dev in doc["devices"]:
            device = str(dev["device"])
            version.add_metric([device], dev["version"])
            graphs = dev.get("graph_bytes") or {}
            held.add_metric([device], graphs.get("held", 0.0))
            buffers.add_metric([device], graphs.get("buffers") or 0.0)
            if graphs.get("bound") is not None:
                bound.add_metric([device], graphs["bound"])
            lag.add_metric([device], dev["lag"]["count"], dev["lag"]["seconds_sum"])
            for p in dev["profiles"]:
                for d in p["dims"]:
                    gears.add_metric([device, p["name"], d["name"]], len(d["gears"]))
                    padding.add_metric([device, p["name"], d["name"]], d["padding"])
                    costs.add([device, p["name"], d["name"]], d.get("costs"))
        unsaved = GaugeMetricFamily(
            "gearshift_state_unsaved_seconds", "Seconds since the first failed state save not "
            "followed by a good one (0: saved; the saves are retried until one succeeds)")
        since = doc.get("unsaved_since")
        unsaved.add_metric([], doc["time"] - since if isinstance(since, (int, float)) else 0.0)
        yield from (consumed, dropped, rejected, reclaimed, exited, rounds, version, lag, gears,
                    padding, measured, held, buffers, bound, unsaved, *costs.families)
        if doc.get("fleet"):
            yield from _fleet(doc["fleet"], GaugeMetricFamily, CounterMetricFamily)


def _fleet(f: dict[str, Any], gauge: Any, counter: Any) -> Iterator[Any]:
    """The status document's `fleet` (`controller/fleet.py`, `Fleet.view`) as metrics."""
    joined = gauge("gearshift_fleet_joined", "1 while the last sync with the fleet store "
                   "succeeded, 0 while the node runs alone (or has not synced yet)",
                   labels=["state"])
    joined.add_metric([f["state"]], 1.0 if f["state"] == "joined" else 0.0)
    nodes = gauge("gearshift_fleet_nodes", "Other live nodes read at the last sync")
    nodes.add_metric([], f["nodes"])
    expired = gauge("gearshift_fleet_expired_nodes", "Nodes past their TTL at the last sync")
    expired.add_metric([], f["expired"])
    ago = gauge("gearshift_fleet_seconds_since", "Seconds since the last publish and read "
                "(absent: none yet)", labels=["what"])
    for what in ("published", "read"):
        if f.get(f"{what}_ago") is not None:
            ago.add_metric([what], f[f"{what}_ago"])
    counts = counter("gearshift_fleet_operations", "Fleet store operations, by outcome",
                     labels=["outcome"])
    for key in ("publishes", "reads", "failures", "bad_objects"):
        counts.add_metric([key], f[key])
    apart = gauge("gearshift_fleet_disagreement", "Share of the gears any other member holds "
                  "that not all hold", labels=["profile", "dim"])
    for p in f["profiles"]:
        for dim, value in p["disagreement"].items():
            apart.add_metric([p["profile"], dim], value)
    yield from (joined, nodes, expired, ago, counts, apart)


class _CostFamilies:
    """The measured costs of each dim (the status document's `costs`) as gauges."""

    def __init__(self, gauge: Any, labels: list[str]) -> None:
        self.count = gauge("gearshift_cost_measurements", "Measurements the fits rest on",
                           labels=labels)
        self.replay = gauge("gearshift_replay_seconds", "Median measured replay seconds, per"
                            " measured gear", labels=[*labels, "gear"])
        self.fit = gauge("gearshift_replay_fit_seconds", "Fitted (monotone) replay seconds, per"
                         " measured gear", labels=[*labels, "gear"])
        self.capture = gauge("gearshift_capture_seconds", "Median measured capture seconds,"
                             " per measured gear", labels=[*labels, "gear"])
        self.capture_fit = gauge("gearshift_capture_fit_seconds", "Fitted (monotone) capture"
                                 " seconds, per measured gear", labels=[*labels, "gear"])
        self.bytes = gauge("gearshift_graph_cost_bytes", "Graph bytes fitted as a + b*gear"
                           " (term a: bytes, b: bytes per gear unit)", labels=[*labels, "term"])
        self.families = (self.count, self.replay, self.fit, self.capture, self.capture_fit,
                         self.bytes)

    def add(self, labels: list[str], costs: dict[str, Any] | None) -> None:
        if not costs:
            return
        self.count.add_metric(labels, costs["measurements"])
        for family, key in ((self.replay, "replay_seconds"), (self.fit, "replay_fit"),
                            (self.capture, "capture_seconds"),
                            (self.capture_fit, "capture_fit")):
            for gear, seconds in zip(costs["gears"], costs.get(key) or (), strict=False):
                family.add_metric([*labels, str(gear)], seconds)
        for term in ("a", "b"):
            self.bytes.add_metric([*labels, term], costs["graph_bytes"][term])
