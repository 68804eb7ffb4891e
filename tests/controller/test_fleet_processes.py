"""Three `gearshift serve` processes sharing one fleet store, with real workers (`gs.connect`
in child processes): the third, started after the other two learned, publishes the fleet's
gears in its first snapshot. On a directory, and on s3:// against moto's S3 server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import gearshift as gs
from gearshift.cli import main
from gearshift.shm import cleanup

from .test_processes import FAST, owner, wait_for
from .workers import WAIT

DIMS = {"S": gs.Dim(max=64)}
WORKER = """
import sys, time
import gearshift as gs
with gs.connect(sys.argv[1]) as client:
    prof = client.profile("decode", {"S": gs.Dim(max=64)})
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        with prof.request(S=40):
            pass
        time.sleep(0.002)
"""
FLEET = ["--set=fleet_publish_seconds=0.3", "--set=fleet_ttl_seconds=60",
         "--set=fleet_model=test"]


@pytest.fixture
def fleet_nodes(namespace: str, tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start `gearshift serve` for namespace+suffix on a fleet URL; every process is ended."""
    started: list[tuple[str, subprocess.Popen]] = []

    def start(suffix: str, url: str, env: dict[str, str] | None = None) -> str:
        ns = namespace + suffix
        proc = subprocess.Popen(
            [sys.executable, "-m", "gearshift", "serve", "-n", ns, "--state-dir",
             str(tmp_path / ns), "--log-level", "WARNING", "--fleet", url,
             f"--set=fleet_node=node-{suffix}", *FAST, *FLEET],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})})
        started.append((ns, proc))
        wait_for(lambda: owner(ns) == proc.pid or proc.poll() is not None, "a controller")
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        return ns

    def worker(ns: str, env: dict[str, str] | None = None) -> None:
        started.append(("", subprocess.Popen([sys.executable, "-c", WORKER, ns, str(WAIT)],
                                             env={**os.environ, **(env or {})})))

    start.worker = worker  # type: ignore[attr-defined]
    yield start
    for _, proc in reversed(started):
        proc.kill()
        proc.wait(WAIT)
        if proc.stderr:
            proc.stderr.close()
    for ns, _ in started:
        if ns:
            cleanup(ns)


def _fleet_gears(url: str, env: dict[str, str] | None = None) -> dict[str, list[int]]:
    out = CliRunner().invoke(main, ["fleet", "status", url, "--json"], env=env)
    assert out.exit_code == 0, out.output
    profiles = json.loads(out.output)["profiles"]
    return profiles[0]["gears"]["S"] if profiles else {}


def _snapshot(ns: str) -> tuple[int, list[int]]:
    out = CliRunner().invoke(main, ["snapshot", "-n", ns, "--json"])
    assert out.exit_code == 0, out.output
    (dev,) = json.loads(out.output)
    return dev["version"], dev["profiles"]["decode"]["gears"]["S"]


def _late_node_takes_the_fleets_gears(start: Callable[..., str], url: str,
                                      env: dict[str, str] | None = None) -> None:
    a, b = start("a", url, env), start("b", url, env)
    start.worker(a, env)  # type: ignore[attr-defined]
    start.worker(b, env)  # type: ignore[attr-defined]
    wait_for(lambda: (g := _fleet_gears(url, env)).keys() == {"node-a", "node-b"}
             and all(40 in gears for gears in g.values()), "both nodes to learn 40")
    learned = _fleet_gears(url, env)
    c = start("c", url, env)
    with gs.connect(c) as client:  # a real worker registers: the first snapshot is published
        client.profile("decode", DIMS)
        version, gears = _snapshot(c)
    assert version == 1 and 40 in gears and gears in learned.values()


def test_a_third_node_starts_on_the_gears_two_others_learned(fleet_nodes, tmp_path) -> None:
    _late_node_takes_the_fleets_gears(fleet_nodes, str(tmp_path / "fleet"))


def _moto_server() -> tuple[subprocess.Popen, str] | None:
    try:
        import moto.server  # noqa: F401
        import s3fs  # noqa: F401
    except ImportError:
        return None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return proc, endpoint
        except OSError:
            time.sleep(0.1)
    proc.kill()
    proc.wait()
    return None


def test_the_same_on_s3_against_motos_server(fleet_nodes) -> None:
    server = _moto_server()
    if server is None:
        pytest.skip("moto[server] and s3fs (the test extra) are needed for an S3 server")
    proc, endpoint = server
    env = {"FSSPEC_S3_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    try:
        import fsspec.config
        import s3fs

        saved = {k: os.environ.get(k) for k in env}
        conf = dict(fsspec.config.conf)
        os.environ.update(env)
        fsspec.config.set_conf_env(fsspec.config.conf)  # read at import: this process's CLI
        try:
            s3fs.S3FileSystem(endpoint_url=endpoint).mkdir("fleet-bucket")
            _late_node_takes_the_fleets_gears(fleet_nodes, "s3://fleet-bucket/llama", env)
        finally:
            fsspec.config.conf.clear()
            fsspec.config.conf.update(conf)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    finally:
        proc.kill()
        proc.wait(WAIT)
