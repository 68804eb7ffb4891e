"""`gearshift demo --model llama --tp 2`: each worker an instance of two gloo ranks, each its shard
of the Llama; both arms tensor parallel, every step's gears all-gathered outside gearshift and
the driver's outputs checked against the unsharded model; and the refusals of a bad --tp."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

pytest.importorskip("transformers")

from gearshift.cli import main
from gearshift.clikit import EXIT_ERROR, EXIT_USAGE
from gearshift.tools.demo.llama import LlamaShape
from gearshift.tools.demo.lockstep import TOLERANCE
from gearshift.tools.demo.table import table
from gearshift.tools.demo.tp import tp_refusal

from .test_cli import ADAPTIVE, RESULT, RUN, WAIT, assert_all_gone, session_processes
from .test_cli import demo as demo_process
from .test_llama import small_source


def test_tp_must_divide_the_heads_the_kv_heads_and_the_mlp_width() -> None:
    assert tp_refusal(1) is None and tp_refusal(2) is None
    why = tp_refusal(4)  # 4 heads but 2 KV heads
    assert why is not None and "--tp 4" in why and "2 KV heads" in why and "1 or 2" in why
    assert tp_refusal(4, LlamaShape(kv_heads=4)) is None
    assert "MLP width 128" in (tp_refusal(3, LlamaShape(heads=6, kv_heads=6)) or "")


@pytest.mark.parametrize(("args", "said"), [
    (["--model", "llama", "--tp", "3"], "--tp 3 must divide the Llama's 4 attention heads"),
    (["--model", "llama", "--tp", "4"], "2 KV heads"),
    (["--tp", "2"], "--tp 2 runs --model llama with --backend graphs only"),
    (["--model", "llama", "--backend", "compile", "--tp", "2"], "--backend graphs only"),
])
def test_a_bad_tp_is_refused_naming_the_option(args: list[str], said: str) -> None:
    out = CliRunner().invoke(main, ["demo", *args])
    assert out.exit_code == EXIT_USAGE and said in out.output, out.output


def test_the_table_names_the_instances_and_the_checks_outside_gearshift() -> None:
    check = {"steps": 2433, "differed": 0, "checked": 305, "mismatched": 0, "worst_error": 3e-7}
    result = {**RESULT, "tp": 2, "workers": 2, "adaptive": {**ADAPTIVE, "lockstep": check},
              "static": {**RUN, "lockstep": {**check, "worst_error": 2e-7}}}
    text = table(result)
    assert "2 instances of 2 tensor-parallel ranks" in text
    lines = {line.split("  ")[0]: line.split() for line in text.splitlines()}
    assert lines["tensor-parallel steps: gears differed"][-4:] == ["2,433:", "0", "2,433:", "0"]
    checked = next(x for x in text.splitlines() if "outputs checked" in x).split()
    assert checked[-8:] == ["305:", "0", "/", "3e-07", "305:", "0", "/", "2e-07"]
    assert "tensor-parallel" not in table(RESULT) and "4 workers" in table(RESULT)  # --tp 1


def test_tensor_parallel_llama_demo_agrees_on_every_step_and_matches_the_reference(
    namespace: str, tmp_path: Path
) -> None:
    # rounds every 5 s of trace: the adaptive arm's group changes its gears during the run
    proc = demo_process(namespace, "--model", "llama", "--tp", "2", "--workers", "1",
                        "--trace", small_source(tmp_path), "--seconds", "5", "--json",
                        "--set", "update_interval_seconds=5", "--set", "check_interval_seconds=5")
    out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    result = json.loads(out)
    assert result["tp"] == 2 and result["workers"] == 1
    adaptive, static = result["adaptive"], result["static"]
    assert adaptive["requests"] == static["requests"] == result["requests"] > 0
    assert adaptive["useful_tokens"] == static["useful_tokens"]  # requests counted once
    for arm in (adaptive, static):
        check = arm["lockstep"]
        assert check["steps"] == result["requests"] and check["differed"] == 0, check
        assert check["checked"] > 0 and check["mismatched"] == 0, check
        assert check["worst_error"] <= TOLERANCE
    assert adaptive["captures"] > 0 and adaptive["adds"] > 0  # captured in lockstep
    assert adaptive["decision_rounds"]["count"] >= 1 and adaptive["snapshot_version"] >= 1
    assert static["captures"] == 0 and static["replayed_tokens"] == static["padded_tokens"]
    text = table(result)
    assert "1 instance of 2 tensor-parallel ranks" in text
    assert "tensor-parallel steps: gears differed" in text
    assert_all_gone(proc, namespace)


def test_a_rank_that_dies_ends_the_run_with_an_error_naming_it_and_leaves_nothing(
    namespace: str
) -> None:
    proc = demo_process(namespace, "--model", "llama", "--tp", "2", "--workers", "1",
                        "--seconds", "30")
    assert proc.stderr is not None
    deadline = time.monotonic() + WAIT
    while "adaptive" not in proc.stderr.readline():  # both arms are running
        assert time.monotonic() < deadline and proc.poll() is None
    ranks = [pid for pid in session_processes(proc.pid) if pid != proc.pid and "spawn_main" in
             Path(f"/proc/{pid}/cmdline").read_text()]
    assert len(ranks) == 2, ranks  # the instance's two ranks (not the resource tracker)
    os.kill(ranks[-1], signal.SIGKILL)
    _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == EXIT_ERROR, err
    assert "error: demo worker" in err and "of instance 0)" in err, err
    assert_all_gone(proc, namespace)
