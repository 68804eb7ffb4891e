"""The GPU check's harness (`tools/gpu/check.sh`, `gearshift.tools.bench.graphs_gpu`) on the CPU:
every step's line survives a step that hangs, faults or is killed, the timeouts nest, and
without CUDA it reports that and exits 0."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gearshift.tools.bench import graphs_gpu
from gearshift.tools.bench.graphs_gpu import BUDGET, SPARE, Step, run_steps
from gearshift.tools.bench.graphs_gpu_probes import PROBES, RAW, SAFE

ROOT = Path(__file__).resolve().parents[3]


def _py(name: str, code: str, seconds: int = 10) -> Step:
    return Step(name, (sys.executable, "-c", code), seconds)


OK = _py("ok", "print('{\"value\": 1}', flush=True)")
HANG = _py("hang", "import time; print('{\"partial\": 2}', flush=True); time.sleep(60)", 2)
FAULT = _py("fault", "import os; print('{\"partial\": 3}', flush=True); os.abort()")


def _lines(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines() if x.startswith("{")]


def test_each_step_reports_whether_it_ends_hangs_or_faults(capsys: pytest.CaptureFixture) -> None:
    assert run_steps([OK, HANG, FAULT, OK], budget=30) == 2
    ok, hang, fault, last = _lines(capsys.readouterr().out)
    assert ok["step"] == "ok" and ok["rc"] == 0 and ok["value"] == 1
    assert hang["rc"] == 124 and hang["partial"] == 2 and "timed out" in hang["stderr"]
    assert fault["rc"] < 0 and fault["partial"] == 3  # killed by its signal, its line kept
    assert last["rc"] == 0  # a fault ends only its own process


def test_a_spent_budget_skips_the_rest_with_a_line(capsys: pytest.CaptureFixture) -> None:
    assert run_steps([HANG, OK], budget=2.5) == 1
    hang, ok = _lines(capsys.readouterr().out)
    assert hang["rc"] == 124 and ok == {"step": "ok", "rc": None,
                                        "skipped": "the check's budget is spent"}


def test_lines_printed_before_the_outer_timeout_survive_it() -> None:
    code = ("import sys; from gearshift.tools.bench.graphs_gpu import Step, run_steps;"
            " ok = Step('ok', (sys.executable, '-c', 'print(1)'), 5);"
            " hang = Step('hang', (sys.executable, '-c', 'import time; time.sleep(60)'), 60);"
            " run_steps([ok, hang])")
    r = subprocess.run(["timeout", "-k", "1", "4", sys.executable, "-c", code],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 124
    assert _lines(r.stdout) == [{"step": "ok", "rc": 0, "seconds": _lines(r.stdout)[0]["seconds"],
                                 "stdout": "1\n"}]


def test_the_step_timeouts_fit_inside_the_outer_one_with_room_to_spare() -> None:
    script = (ROOT / "tools/gpu/check.sh").read_text()
    (outer,) = re.findall(r"timeout -k \d+ (\d+) python3 -m gearshift.tools.bench.graphs_gpu",
                          script)
    assert int(outer) == BUDGET + SPARE and SPARE >= 30
    todo = graphs_gpu.steps()
    assert sum(s.seconds for s in todo) <= BUDGET < 6 * 60 - SPARE  # rerun once in 15 minutes
    names = [s.name for s in todo]
    assert names[-4:] == ["raw_workspace", "raw_threads", "raw_rng", "raw_empty_cache"]
    assert set(PROBES) == {*SAFE, *RAW, "adoption"} and set(PROBES) < set(names)
    assert names.index("pytest") < names.index("bench") < names.index("raw_workspace")


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the check runs for real")
def test_without_cuda_the_check_says_so_and_exits_cleanly() -> None:
    r = subprocess.run(["bash", str(ROOT / "tools/gpu/check.sh")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    (line,) = _lines(r.stdout)
    assert line["step"] == "environment" and line["cuda"] is False
    assert line["skipped"] == "no CUDA device" and line["torch"] == torch.__version__
