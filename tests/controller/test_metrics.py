from __future__ import annotations

import os
import socket
import urllib.request
from pathlib import Path

import pytest
from fakeclock import FakeClock

from gearshift.controller.config import ControllerConfig
from gearshift.controller.controller import Controller
from gearshift.core.config import PolicyConfig
from gearshift.shm import ring

from .workers import Worker


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_metrics_endpoint_serves_the_status_document(namespace: str, tmp_path: Path) -> None:
    port = _free_port()
    config = ControllerConfig(namespace=namespace, state_dir=str(tmp_path), metrics_port=port)
    clock = FakeClock(100.0)
    with Controller.open(config, PolicyConfig(), clock=clock) as controller:
        worker = Worker(namespace, 0, clock)
        worker.register(0, "decode", serve=controller.step)
        for value in (40, 40, 64):
            worker.put(0, value)
        assert worker.ring.write(1, *ring.measured(0, 1, 0, 8, 0.25, 1024, 1e-3))
        clock.advance(1.0)
        controller.step()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode()
        worker.close()
    lines = set(text.splitlines())
    worker_labels = f'device="0",pid="{os.getpid()}",slot="{worker.slot}"'
    assert f"gearshift_events_consumed_total{{{worker_labels}}} 4.0" in lines
    assert f"gearshift_events_dropped_total{{{worker_labels}}} 0.0" in lines
    assert 'gearshift_snapshot_version{device="0"} 1.0' in lines
    assert 'gearshift_gears{device="0",dim="B",profile="decode"} 7.0' in lines
    assert any(line.startswith('gearshift_padding_ratio{device="0",dim="B"') for line in lines)
    assert "gearshift_decision_round_seconds_count 1.0" in lines
    assert 'gearshift_propagation_lag_seconds_count{device="0"} 0.0' in lines
    dim = 'device="0",dim="B"'
    assert "gearshift_measurements_total 1.0" in lines
    assert {"gearshift_workers_exited_total 0.0", "gearshift_workers_reclaimed_total 0.0"} <= lines
    assert "gearshift_state_unsaved_seconds 0.0" in lines  # saved
    assert f'gearshift_cost_measurements{{{dim},profile="decode"}} 1.0' in lines
    assert f'gearshift_replay_seconds{{{dim},gear="8",profile="decode"}} 0.001' in lines
    assert f'gearshift_capture_seconds{{{dim},gear="8",profile="decode"}} 0.25' in lines
    assert f'gearshift_capture_fit_seconds{{{dim},gear="8",profile="decode"}} 0.25' in lines
    assert f'gearshift_graph_cost_bytes{{{dim},profile="decode",term="b"}} 0.0' in lines
    assert not any(line.startswith("gearshift_replay_fit_seconds{") for line in lines)  # 1 gear
    # nothing priced yet (one gear measured): no graph bytes held, no bound
    assert 'gearshift_graph_bytes{device="0"} 0.0' in lines
    assert 'gearshift_graph_buffer_bytes{device="0"} 0.0' in lines
    assert not any(line.startswith("gearshift_graph_bytes_bound{") for line in lines)


def test_metrics_listen_on_metrics_addr_only(namespace: str, tmp_path: Path) -> None:
    port = _free_port()
    config = ControllerConfig(
        namespace=namespace, state_dir=str(tmp_path), metrics_port=port, metrics_addr="127.0.0.2"
    )
    assert ControllerConfig().metrics_addr == "127.0.0.1"  # this host only, by default
    with Controller.open(config, PolicyConfig(), clock=FakeClock(100.0)):
        with urllib.request.urlopen(f"http://127.0.0.2:{port}/metrics", timeout=10) as reply:
            assert reply.status == 200
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=10):
            pass
