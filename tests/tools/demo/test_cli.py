"""`gearshift demo` as a user runs it: a short run's JSON, and cleanup, also on Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from gearshift.cli import main
from gearshift.clikit import EXIT_ERROR, EXIT_USAGE
from gearshift.tools.demo.cli import EXIT_INTERRUPTED, table

WAIT = 240.0  # seconds: two workers import torch on a loaded 2-core machine
FIGURES = {
    "seconds",
    "requests",
    "useful_tokens",
    "useful_tokens_per_second",
    "useful_tokens_per_cpu_second",
    "padded_tokens",
    "padding_overhead",
    "model_seconds",
    "useful_model_seconds",
    "compute_overhead",
    "replayed_tokens",
    "captured_tokens",
    "worker_cpu_seconds",
    "request_cpu_seconds",
    "model_cpu_seconds",
    "capture_cpu_seconds",
    "controller_cpu_seconds",
    "demo_cpu_seconds",
    "worker_peak_rss_mb",
    "dims",
    "adds",
    "evictions",
    "captures",
    "replays",
    "eager",
    "snapshot_version",
    "versions_missed",
    "decision_rounds",
    "propagation_lag",
    "priced_adds",
    "priced_reasons",
    "capture_share",
}


def default_sigint() -> None:
    """In the child before exec: SIGINT as a terminal's user expects it, even when the suite
    was started with it ignored (`nohup ... &`), which children inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def demo(namespace: str, *args: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "gearshift", "demo", "--namespace", namespace, *args]
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own session: every process it starts can be found
        preexec_fn=default_sigint,
    )


def session_processes(sid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except (OSError, ValueError):
            continue
        if int(stat.rsplit(")", 1)[1].split()[3]) == sid:
            found.append(int(entry.name))
    return found


def assert_all_gone(proc: subprocess.Popen, namespace: str) -> None:
    deadline = time.monotonic() + 10.0  # the resource tracker ends on its own, just after
    while session_processes(proc.pid):
        assert time.monotonic() < deadline, f"left running: {session_processes(proc.pid)}"
        time.sleep(0.1)
    assert not [n for n in os.listdir("/dev/shm") if namespace in n]


def test_short_demo_prints_both_runs_and_leaves_nothing(namespace: str) -> None:
    proc = demo(namespace, "--seconds", "10", "--workers", "2", "--json")
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    result = json.loads(out)
    keys = {"adaptive", "static", "speedup", "cpu_speedup", "compute_ratio", "model", "stride"}
    assert keys | {"trace", "time_compression", "round_interval"} <= set(result)
    adaptive, static = result["adaptive"], result["static"]
    assert set(adaptive) == set(static) | {"graph_bytes"} and set(static) == FIGURES
    held = adaptive["graph_bytes"]  # the priced graphs (and buffers) against the bound
    assert set(held) == {"held", "bound", "buffers"} and held["held"] >= held["buffers"] >= 0
    assert held["bound"] is None or held["bound"] > 0
    assert adaptive["requests"] == static["requests"] == result["requests"] > 0
    assert adaptive["useful_tokens"] == static["useful_tokens"]
    assert result["speedup"] == (
        adaptive["useful_tokens_per_second"] / static["useful_tokens_per_second"]
    )
    assert result["compute_ratio"] == static["model_seconds"] / adaptive["model_seconds"]
    assert set(adaptive["dims"]) == {"SEQLEN"} and adaptive["snapshot_version"] >= 1
    # one profile: its figures are the run's (but for the arm-wide ones)
    (name, one), = result["profiles"].items()
    assert name == "demo" and one["trace"] == "azure_conv_prefill"
    assert set(one["adaptive"]) == (FIGURES - {"demo_cpu_seconds", "decision_rounds"}
                                    | {"measured_costs"})
    measured = one["adaptive"]["measured_costs"]["SEQLEN"]  # the workers' graphs, fitted
    assert measured["measurements"] >= 2 and len(measured["replay_seconds"]) >= 2
    assert one["adaptive"]["useful_tokens"] == adaptive["useful_tokens"]
    assert one["speedup"] == pytest.approx(result["speedup"])
    assert adaptive["decision_rounds"]["count"] >= 1 and adaptive["controller_cpu_seconds"] > 0
    assert static["adds"] == static["evictions"] == static["captures"] == 0
    assert static["snapshot_version"] is static["decision_rounds"] is None
    assert static["replayed_tokens"] == static["padded_tokens"] > static["useful_tokens"]
    assert static["compute_overhead"] > static["padding_overhead"] > 0  # attention: S^2
    assert "adaptive" in err and "static" in err  # the progress lines
    # the arms ran in alternating slices over the same rows: a speedup per slice
    for key in ("speedup_slices", "cpu_speedup_slices"):
        spread = result[key]
        assert len(spread["slices"]) == result["slices"] >= 2
        assert spread["min"] <= spread["median"] <= spread["max"] and spread["min"] > 0
    assert static["worker_cpu_seconds"] > 0 and static["controller_cpu_seconds"] == 0
    # the request threads' CPU inside requests: part of the workers' (the static arm's: all)
    for arm in (static, adaptive):
        assert 0 < arm["request_cpu_seconds"] <= arm["worker_cpu_seconds"] * 1.001 + 1e-3
        # of which the model's own: the rest is the request path and the runner's work
        assert 0 < arm["model_cpu_seconds"] < arm["request_cpu_seconds"]
    assert_all_gone(proc, namespace)


def test_short_compiled_demo_reports_each_arms_compiles_and_leaves_nothing(
        namespace: str, tmp_path: Path) -> None:
    # Dynamo's eager backend and prefills of at most 64 tokens (7 gears): the demo's path of
    # compiles, caches and counts, fast enough for 2 loaded cores (Inductor's gears are
    # checked against eager in tests/graphs)
    trace = tmp_path / "short.csv"
    sizes = np.random.default_rng(0).integers(1, 65, 2000)
    trace.write_text("t,SEQLEN\n" + "".join(f"{i * 0.15:.2f},{n}\n" for i, n in enumerate(sizes)))
    proc = demo(namespace, "--backend", "compile", "--compile-backend", "eager", "--seconds",
                "5", "--workers", "2", "--trace", str(trace), "--json")
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    result = json.loads(out)
    assert result["backend"] == "compile" and result["compile_backend"] == "eager"
    adaptive, static = result["adaptive"], result["static"]
    assert set(adaptive) == set(static) | {"graph_bytes"}
    assert set(static) == FIGURES | {"compile"}
    assert adaptive["requests"] == static["requests"] == result["requests"] > 0
    # every replay counted though the counter is outside the compiled code
    assert static["replayed_tokens"] == static["padded_tokens"] > static["useful_tokens"]
    gears = len(static["dims"]["SEQLEN"]["final_gears"])
    for arm in (adaptive, static):  # each worker compiled each initial gear once, no breaks
        assert arm["compile"]["startup"]["compiles"] == 2 * gears
        assert arm["compile"]["startup"]["graph_breaks"] == 0
    assert static["compile"]["run"]["compiles"] == 0  # static gears: compiled before its run
    assert adaptive["compile"]["run"]["compiles"] == adaptive["captures"]
    text = table(result)
    assert "compiles: all / cold / cache hits" in text and "before the run" in text
    assert_all_gone(proc, namespace)


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm twice"])
def test_an_interrupt_ends_every_process_and_segment_it_started(namespace: str,
                                                                how: str) -> None:
    proc = demo(namespace, "--seconds", "30", "--workers", "2")
    assert proc.stderr is not None
    deadline = time.monotonic() + WAIT
    while "adaptive" not in proc.stderr.readline():  # the controller and workers are up
        assert time.monotonic() < deadline and proc.poll() is None
    assert [n for n in os.listdir("/dev/shm") if namespace in n]
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    else:  # as `pkill` and a `timeout` around it send, the second during the cleanup
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(0.2)
        os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == EXIT_INTERRUPTED, err
    assert "interrupted" in err and "Traceback" not in err
    assert_all_gone(proc, namespace)


def test_bad_options_fail_before_starting_anything() -> None:
    runner = CliRunner()
    bad_trace = runner.invoke(main, ["demo", "--trace", "no-such-trace"])
    assert bad_trace.exit_code == EXIT_ERROR and "trace not found" in bad_trace.output
    bad_key = runner.invoke(main, ["demo", "--set", "no_such_key=1"])
    assert bad_key.exit_code == EXIT_USAGE and "no_such_key" in bad_key.output
    assert runner.invoke(main, ["demo", "--workers", "0"]).exit_code == EXIT_USAGE


RUN = {
    "seconds": 10.0,
    "requests": 500,
    "useful_tokens": 1000,
    "useful_tokens_per_second": 100.0,
    "useful_tokens_per_cpu_second": 50.0,
    "padding_overhead": 0.5,
    "compute_overhead": 0.8,
    "replayed_tokens": 1500,
    "captured_tokens": 0,
    "worker_cpu_seconds": 19.0,
    "request_cpu_seconds": 17.0,
    "model_cpu_seconds": 16.0,
    "capture_cpu_seconds": 0.0,
    "controller_cpu_seconds": 0.0,
    "demo_cpu_seconds": 0.1,
    "worker_peak_rss_mb": 400.0,
    "adds": 0,
    "evictions": 0,
    "priced_adds": 0,
    "priced_reasons": [],
    "capture_share": 0.0,
    "captures": 0,
    "eager": 0,
    "snapshot_version": None,
    "decision_rounds": None,
    "propagation_lag": None,
    "dims": {"SEQLEN": {"padding_overhead": 0.5, "mean_gears": 15.0,
                        "final_gears": list(range(15))}},
}
ADAPTIVE = {
    **RUN,
    "seconds": 8.0,
    "useful_tokens_per_second": 125.0,
    "adds": 3,
    "evictions": 4,
    "snapshot_version": 7,
    "decision_rounds": {"count": 58},
    "propagation_lag": {"mean_ms": 42.0, "last_ms": 40.0, "count": 3},
    "dims": {"SEQLEN": {"padding_overhead": 0.2, "mean_gears": 9.5, "final_gears": [3, 9]}},
}
RESULT = {
    "adaptive": ADAPTIVE,
    "static": RUN,
    "speedup": 1.25,
    "cpu_speedup": 1.1,
    "compute_ratio": 1.3,
    "trace": "t",
    "model": {"about": "a block"},
    "requests": 500,
    "stride": 2,
    "rows": 1000,
    "workers": 4,
    "time_compression": 100.0,
    "round_interval": 18.7,
    "seconds": 30.0,
}


def test_table_puts_the_runs_side_by_side() -> None:
    text = table(RESULT)
    assert "1 row in 2 of 1,000" in text and "model: a block" in text
    assert "decision rounds 19 s of trace apart or more" in text
    assert "1.25x" in text and "1.10x" in text and "1.30x" in text
    lines = {line.split("  ")[0]: line.split() for line in text.splitlines()}
    assert lines["adds / evictions"][-6:] == ["3", "/", "4", "0", "/", "0"]
    assert lines["decision rounds"][-2:] == ["58", "-"]
    assert lines["propagation lag (trace time), mean (n)"][-4:] == ["42", "ms", "(3)", "-"]
    gears = [line.split() for line in text.splitlines() if "SEQLEN gears" in line]
    assert gears == [["SEQLEN", "gears,", "mean", "/", "final", "9.5", "/", "2", "15.0", "/",
                      "15"]]
    assert "profile" not in text  # one profile: no section of its own


def test_table_of_two_profiles_gives_each_then_both() -> None:
    rows = {"padding_overhead": 0.1, "mean_gears": 6.0, "final_gears": [1, 8, 32]}
    decode = {"adaptive": {**ADAPTIVE, "dims": {"BATCHSIZE": rows}, "adds": 1},
              "static": {**RUN, "dims": {"BATCHSIZE": {**rows, "mean_gears": 7.0}}},
              "speedup": 0.97, "cpu_speedup": 1.01, "compute_ratio": 1.02, "trace": "t_decode",
              "requests": 400, "speedup_slices": {"median": 0.99, "min": 0.9, "max": 1.1,
                                                  "slices": [0.9, 0.99, 1.1]}}
    prefill = {"adaptive": ADAPTIVE, "static": RUN, "speedup": 1.4, "cpu_speedup": 1.35,
               "compute_ratio": 1.6, "trace": "t_prefill", "requests": 100}
    text = table({**RESULT, "trace": "t", "profiles": {"prefill": prefill, "decode": decode}})
    assert "t (prefill: t_prefill, decode: t_decode, one timeline)" in text
    sections = text.split("\nprofile ")
    assert sections[1].startswith("prefill (SEQLEN): t_prefill, 100 requests")
    assert sections[2].startswith("decode (BATCHSIZE): t_decode, 400 requests")
    assert "1.40x" in sections[1] and "decision rounds" not in sections[1]
    decode_part, every = sections[2].split("\nevery profile\n")
    assert "0.97x; over 3 interleaved slices: median 0.99x (0.90-1.10)" in decode_part
    lines = {line.strip().split("  ")[0]: line.split() for line in decode_part.splitlines()}
    assert lines["BATCHSIZE gears, mean / final"][-6:] == ["6.0", "/", "3", "7.0", "/", "3"]
    assert lines["adds / evictions"][-6:] == ["1", "/", "4", "0", "/", "0"]
    assert "decision rounds" in every and "SEQLEN" not in every and "1.25x" in every


def test_table_ends_on_one_plain_sentence_of_what_was_measured_the_figures_in_json() -> None:
    costs = {"measurements": 12, "replay_seconds": {8: 0.001, 64: 0.004, 512: 0.02, 4096: 0.3,
                                                    8192: 0.7},
             "capture_seconds": {8: 0.002, 64: 0.003, 512: 0.01, 4096: 0.2, 8192: 0.5},
             "graph_bytes": {"a": 0, "b": 64}}
    reasons = ["SEQLEN 900: plan of 9 gears: padding down 1 pts, saves 2 s over 19 s for 0.4 s "
               "of capture"]
    adaptive = {**ADAPTIVE, "adds": 7, "priced_adds": 5, "capture_share": 0.058,
                "priced_reasons": reasons,
                "measured_costs": {"SEQLEN": costs}}
    text = table({**RESULT, "adaptive": adaptive,
                  "profiles": {"demo": {"adaptive": adaptive, "static": RUN}}})
    lines = {line.strip().split("  ")[0]: line.split() for line in text.splitlines()}
    assert lines["adds priced in measured seconds"][-2:] == ["5", "0"]
    assert lines["captures' share of workers' CPU"][-2:] == ["5.8%", "0.0%"]
    # 16 of 17 CPU s in the model over 500 requests: 32,000 µs a request, 2,000 outside it
    assert lines["request CPU µs: model / outside it"][-6:] == ["32,000", "/", "2,000"] * 2
    assert text.splitlines()[-2:] == [  # one plain sentence; the figures are --json's
        "", "The workers timed the 12 graphs they captured; 5 of the 7 gears added went in "
        "because the time they save pays for capturing them (--json has the details)."]
    assert "plan of" not in text and "pts" not in text and " s over " not in text
    unpriced = {**adaptive, "priced_adds": 0, "adds": 4}
    none = table({**RESULT, "adaptive": unpriced,
                  "profiles": {"demo": {"adaptive": unpriced, "static": RUN}}})
    assert none.splitlines()[-1] == ("The workers timed the 12 graphs they captured; none of "
                                     "the 4 gears added was decided on those timings (--json "
                                     "has the details).")
    assert "timed" not in table(RESULT)  # nothing measured: no sentence


def test_the_sentence_names_the_graph_bytes_held_against_the_bound() -> None:
    costs = {"measurements": 12, "replay_seconds": {8: 0.001}, "capture_seconds": {8: 0.002},
             "graph_bytes": {"a": 0, "b": 64}}
    adaptive = {**ADAPTIVE, "adds": 7, "priced_adds": 5, "measured_costs": {"SEQLEN": costs},
                "graph_bytes": {"held": 3.0 * 2**20, "bound": 4.5 * 2**20}}
    text = table({**RESULT, "adaptive": adaptive,
                  "profiles": {"demo": {"adaptive": adaptive, "static": RUN}}})
    assert text.splitlines()[-1].endswith(
        "for capturing them; its graphs hold 3.0 MiB against a 4.5 MiB bound (--json has the "
        "details).")
    adaptive["graph_bytes"]["buffers"] = 0.5 * 2**20
    text = table({**RESULT, "adaptive": adaptive,
                  "profiles": {"demo": {"adaptive": adaptive, "static": RUN}}})
    assert "its graphs hold 3.0 MiB (buffers 0.5 MiB of it) against a 4.5 MiB bound" in text
