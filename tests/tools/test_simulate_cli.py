"""`gearshift simulate` through click's CliRunner: output, exit codes, one-line errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from gearshift.cli import main
from gearshift.clikit import EXIT_ERROR, EXIT_OK, EXIT_USAGE
from gearshift.controller import PolicyConfig

KEYS = {
    "padding_overhead",
    "cost_overhead",
    "device_overhead",
    "captures",
    "capture_seconds",
    "mean_gears",
    "final_gears",
    "adds",
    "evictions",
    "split_events",
    "eager_events",
    "churn_per_hour",
    "peak_graph_bytes",
    "mean_graph_bytes",
}


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["simulate", *args])
    return result.exit_code, result.stdout, result.stderr


def test_json_pow2_on_a_shipped_trace() -> None:
    code, out, _ = run("azure_code_batched", "--policy", "pow2", "--json")
    assert code == EXIT_OK
    data = json.loads(out)
    assert list(data)[:6] == ["trace", "policy", "events", "updates", "wall_seconds", "dims"]
    assert (data["trace"], data["policy"], data["events"]) == ("azure_code_batched", "pow2", 3738)
    assert set(data["dims"]) == {"BATCHSIZE", "SEQLEN"}
    assert all(set(d) == KEYS for d in data["dims"].values())
    assert data["dims"]["SEQLEN"]["final_gears"][-2:] == [4096, 7437]  # the trace's largest


def test_adaptive_json_lists_every_decision_with_its_reason(tmp_path: Path) -> None:
    config = tmp_path / "policy.toml"
    config.write_text("[policy]\nupdate_interval_seconds = 120.0\n")
    code, out, _ = run("azure_code_prefill", "--json", "--config", str(config))
    assert code == EXIT_OK
    data = json.loads(out)
    assert data["policy"] == "adaptive" and data["updates"] == 28  # 3436 s // 120 s
    dim = data["dims"]["SEQLEN"]
    assert set(dim) == KEYS and dim["adds"] + dim["evictions"] > 0
    decisions = data["decisions"]
    assert sum(d["action"] == "add" for d in decisions) == dim["adds"]
    assert all(set(d) == {"t", "trigger", "dim", "gear", "action", "reason"} for d in decisions)
    assert all(d["t"] % 120 == 0 and d["reason"] for d in decisions)


def test_optimal_with_k_per_dim_and_for_all() -> None:
    code, out, _ = run(
        "azure_code_batched", "--policy", "optimal", "--k", "3", "--k", "SEQLEN=7", "--json"
    )
    assert code == EXIT_OK
    dims = json.loads(out)["dims"]
    assert len(dims["BATCHSIZE"]["final_gears"]) == 3 and len(dims["SEQLEN"]["final_gears"]) == 7


def test_static_table_counts_eager_and_split(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("t,BATCHSIZE,SEQLEN\n0,9,100\n1,3,900\n2,2,300\n")
    code, out, _ = run(
        str(trace), "--policy", "static", "--gears", "BATCHSIZE=4", "--gears", "SEQLEN=128,512"
    )
    assert code == EXIT_OK
    header, batch, seq = out.splitlines()[1:-1]  # the last: graph memory
    assert header.split()[:3] == ["dim", "padding", "mean"]
    assert batch.split() == ["BATCHSIZE", "42.86%", "1.00", "0", "0", "0.0", "1", "0", "4"]
    assert seq.split() == ["SEQLEN", "18.46%", "2.00", "0", "0", "0.0", "0", "1", "128,512"]
    code, out, _ = run(
        str(trace),
        "--policy",
        "static",
        "--gears",
        "SEQLEN=128,512",
        "--splittable",
        "SEQLEN=yes",
        "--splittable",
        "BATCHSIZE=no",
    )
    assert code == EXIT_OK
    assert out.splitlines()[2].split()[6:8] == ["0", "0"]  # BATCHSIZE: 1..16, covers
    assert out.splitlines()[3].split()[6:8] == ["1", "0"]


def test_plot_writes_a_png_and_says_where(tmp_path: Path) -> None:
    out = tmp_path / "p.png"
    code, stdout, err = run("azure_code_batched", "--policy", "pow2", "--json", "--plot", str(out))
    assert code == EXIT_OK and json.loads(stdout)["policy"] == "pow2"  # stdout stays JSON
    assert out.read_bytes()[:4] == b"\x89PNG" and str(out) in err


def test_plot_ticks_of_gears_are_ints() -> None:
    from gearshift.tools import simulate as replay
    from gearshift.tools.simulate_plot import figure
    from gearshift.tools.trace import load_trace

    data = load_trace("azure_code_batched")
    dims = replay.policy_dims(data, "pow2", {}, {}, {}, {})
    fig = figure(replay.simulate(data, dims, PolicyConfig(), adaptive=False))
    fig.canvas.draw()
    for axis in fig.axes[: len(dims)]:  # the gears' row
        labels = [t.get_text() for t in axis.get_yticklabels() if t.get_text()]
        assert labels and all(label.isdigit() for label in labels), labels


def test_plot_without_matplotlib_fails_before_the_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = run("azure_code_batched", "--policy", "pow2", "--plot", str(tmp_path / "p"))
    assert code == EXIT_ERROR and out == ""  # no table: it did not replay
    assert err == "error: --plot needs matplotlib: pip install 'gearshift[plot]'\n"


@pytest.mark.parametrize(
    ("text", "code", "message"),
    [
        (None, EXIT_ERROR, "trace not found: "),
        ("t,SEQLEN\n0,1.5\n", EXIT_ERROR, "line 2: SEQLEN=1.5 is not an integer size"),
        ("t,SEQLEN\n0,-1\n", EXIT_ERROR, "line 2: SEQLEN=-1 is not a positive size"),
        ("t,SEQLEN\n1,1\n0,1\n", EXIT_ERROR, "line 3: t=0 is earlier than the event before"),
        ("t,SEQ-LEN\n0,1\n", EXIT_ERROR, "malformed column name 'SEQ-LEN'"),
    ],
)
def test_bad_traces(tmp_path: Path, text: str | None, code: int, message: str) -> None:
    path = tmp_path / "bad.csv"
    if text is not None:
        path.write_text(text)
    exit_code, out, err = run(str(path), "--policy", "pow2")
    assert exit_code == code and out == ""
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "nope=1"], "error: nope: unknown key"),
        (["--set", "window_seconds=-1"], "error: window_seconds: -1.0 is outside"),
        (["--config", "/nonexistent.toml"], "error: config: file not found: /nonexistent.toml"),
        (["--gears", "SEQLEN"], "error: --gears: expected DIM=VALUE, got 'SEQLEN'"),
        (["--gears", "SEQLEN=1,x"], "error: --gears: expected DIM=G1,G2,... of positive ints"),
        (
            ["--gears", "SEQLEN=0,4"],
            "error: --gears: expected DIM=G1,G2,... of positive ints, got SEQLEN=0,4",
        ),
        (["--gears", "SEQ=1,2"], "error: gears: unknown dim SEQ (the trace has SEQLEN)"),
        (["--policy", "pow2", "--gears", "SEQLEN=8"], "error: gears: not used by policy pow2"),
        (["--policy", "optimal", "--k", "0"], "error: --k: expected a positive int, got '0'"),
        (["--policy", "optimal", "--k", "X=2"], "error: k: unknown dim X"),
        (["--splittable", "SEQLEN=maybe"], "error: --splittable: expected DIM=yes|no"),
        (["--cost", "SEQLEN=0,x"], "error: --cost: expected DIM=C0,C1,... numbers"),
        (["--cost", "SEQLEN=1"], "error: Dim.cost must be finite non-negative"),
        (["--cost", "X=0,1"], "error: cost: unknown dim X"),
        (["--capture-seconds", "x"], "error: --capture-seconds: expected A or A,B seconds, got"),
        (["--capture-seconds", "1,2,3"], "error: --capture-seconds: expected A or A,B seconds"),
        (["--capture-seconds", "1,"], "error: --capture-seconds: expected A or A,B seconds"),
        (["--capture-seconds", "-1"], "error: --capture-seconds A: -1.0 is outside [0.0, 3600.0]"),
        (["--capture-seconds", "0,inf"], "error: --capture-seconds B: inf is outside"),
        (["--capture-seconds", "nan"], "error: --capture-seconds A: expected a number, got nan"),
        (["--capture-seconds", "4000"], "error: --capture-seconds A: 4000.0 is outside"),
    ],
)
def test_bad_options_exit_2_with_one_line(args: list[str], message: str) -> None:
    code, out, err = run("azure_code_prefill", *args)
    assert code == EXIT_USAGE and out == ""
    assert err.startswith(message) and err.count("\n") == 1


def test_help_documents_the_defaults() -> None:
    result = CliRunner().invoke(main, ["simulate", "--help"])
    assert result.exit_code == EXIT_OK
    text = " ".join(result.output.split())
    assert "Default: yes for BATCHSIZE" in text and "power-of-two ladder" in text


def test_cost_prices_the_padding_the_policy_and_the_report_count(tmp_path: Path) -> None:
    trace = _slice(tmp_path, "azure_conv_prefill", 3000)  # about ten minutes
    code, out, _ = run(trace, "--cost", "SEQLEN=0,1,0.001", "--json")
    assert code == EXIT_OK
    priced = json.loads(out)["dims"]["SEQLEN"]
    plain = json.loads(run(trace, "--json")[1])["dims"]["SEQLEN"]
    assert plain["cost_overhead"] == pytest.approx(plain["padding_overhead"])
    assert priced["cost_overhead"] > priced["padding_overhead"]  # long requests pad dearer
    assert priced["final_gears"] != plain["final_gears"]
    table = run(trace, "--cost", "SEQLEN=0,1,0.001")[1]
    assert "cost pad" in table.splitlines()[1] and "cost pad" not in run(trace)[1]


def _slice(tmp_path: Path, name: str, events: int) -> str:
    """The first `events` lines of a shipped trace, as a CSV file."""
    from gearshift.tools.trace import resolve

    path = tmp_path / f"{name}.csv"
    path.write_text("".join(resolve(name).read_text().splitlines(True)[: events + 1]))
    return str(path)


def test_capture_seconds_and_workers_price_a_static_set_once() -> None:
    from gearshift.tools.trace import load_trace

    code, out, _ = run("azure_code_batched", "--policy", "pow2", "--capture-seconds", "0.5,0.001",
                       "--workers", "2", "--json")
    assert code == EXIT_OK
    trace = load_trace("azure_code_batched")
    for name, d in json.loads(out)["dims"].items():
        gears = d["final_gears"]
        assert d["captures"] == len(gears) and d["adds"] == d["evictions"] == 0
        assert d["capture_seconds"] == pytest.approx(2 * sum(0.5 + 0.001 * g for g in gears))
        raw = float(trace.dims[name].sum())  # the default cost: the size
        assert d["device_overhead"] == pytest.approx(d["cost_overhead"]
                                                     + d["capture_seconds"] / raw)
    code, out, _ = run("azure_code_batched", "--policy", "pow2", "--json")
    assert all(d["capture_seconds"] == 0.0 and d["device_overhead"] == d["cost_overhead"]
               for d in json.loads(out)["dims"].values())


def test_priced_unpriced_and_eager_start(tmp_path: Path) -> None:
    from gearshift.tools.bench.priced import PREFILL

    trace = _slice(tmp_path, "azure_code_prefill", 1500)  # about ten minutes
    prefill = ",".join(map(repr, PREFILL))  # a prefill's device seconds
    cost = ["--cost", f"SEQLEN={prefill}", "--capture-seconds", "5", "--json"]

    def seq(*more: str) -> dict:
        code, out, err = run(trace, *cost, *more)
        assert code == EXIT_OK, err
        return json.loads(out)["dims"]["SEQLEN"]

    priced, unpriced, eager = seq(), seq("--unpriced"), seq("--unpriced", "--eager-start")
    assert priced["churn_per_hour"] < unpriced["churn_per_hour"] / 2
    assert priced["device_overhead"] < unpriced["device_overhead"]
    # the same decisions, the start-up ladder all captured at once
    assert (eager["adds"], eager["evictions"]) == (unpriced["adds"], unpriced["evictions"])
    assert eager["captures"] > unpriced["captures"]
    assert eager["capture_seconds"] == 5.0 * eager["captures"]
    assert eager["device_overhead"] > unpriced["device_overhead"]


def test_the_table_shows_device_time_only_with_capture_seconds() -> None:
    code, out, _ = run("azure_code_batched", "--policy", "pow2", "--capture-seconds", "1")
    assert code == EXIT_OK
    header, batch = out.splitlines()[1:3]
    assert header.split()[:4] == ["dim", "padding", "device", "captures"]
    d = json.loads(run("azure_code_batched", "--policy", "pow2", "--capture-seconds", "1",
                       "--json")[1])["dims"]["BATCHSIZE"]
    assert d["device_overhead"] > d["padding_overhead"]
    assert batch.split()[1:4] == [f"{d['padding_overhead']:.2%}", f"{d['device_overhead']:.2%}",
                                  "6.0s"]  # 6 gears of 1 s
    assert "device" not in run("azure_code_batched", "--policy", "pow2")[1].splitlines()[1]


@pytest.mark.parametrize("workers", ["0", "4097", "two"])
def test_bad_workers_exit_2_naming_the_option(workers: str) -> None:
    code, out, err = run("azure_code_prefill", "--workers", workers)
    assert code == EXIT_USAGE and out == "" and "'--workers'" in err


def test_help_documents_the_device_options() -> None:
    result = CliRunner().invoke(main, ["simulate", "--help"])
    text = " ".join(result.output.split())
    assert result.exit_code == EXIT_OK
    for phrase in ("--capture-seconds A[,B]", "A + B x gear seconds on each worker",
                   "device_overhead = (padded cost + captures) / raw cost - 1",
                   "--workers", "[default: 1; 1<=x<=4096]", "--unpriced", "--eager-start"):
        assert phrase in text, phrase


def test_plot_labels_every_gear_and_marks_segments_without_requests(tmp_path: Path) -> None:
    from matplotlib.patches import Rectangle

    from gearshift.tools import simulate as replay
    from gearshift.tools.simulate_plot import figure, gear_ticks
    from gearshift.tools.trace import load_trace

    csv = tmp_path / "gap.csv"  # requests in the first minute and after the fifth: none between
    times = [i * 2.0 for i in range(30)] + [300 + i * 2.0 for i in range(30)]
    csv.write_text("t,B\n" + "".join(f"{t},{1 + i % 6}\n" for i, t in enumerate(times)))
    data = load_trace(str(csv))
    dims = replay.policy_dims(data, "static", {"B": (1, 2, 3, 6)}, {}, {}, {})
    fig = figure(replay.simulate(data, dims, PolicyConfig(), adaptive=False))
    fig.canvas.draw()
    top, bottom = fig.axes
    labels = [t.get_text() for t in top.get_yticklabels() if t.get_text()]
    assert labels == ["1", "2", "3", "6"]  # 3 and 6 too, not only the powers of two
    for axis in (top, bottom):
        [shade] = [p for p in axis.patches if isinstance(p, Rectangle)]
        assert (shade.get_x(), shade.get_x() + shade.get_width()) == pytest.approx((1.0, 5.0))
    assert "no requests" in [t.get_text() for t in bottom.get_legend().get_texts()]
    many = gear_ticks([tuple(range(1, 4097))])
    assert len(many) <= 25 and many[0] == 1 and many[-1] == 4096


def test_graph_bytes_and_budget_are_reported_and_checked(tmp_path: Path) -> None:
    trace = _slice(tmp_path, "azure_code_prefill", 1500)  # about ten minutes
    args = (trace, "--cost", "SEQLEN=6.85e-3,3.25e-5,5.3e-10",
            "--capture-seconds", "0.05", "--graph-bytes", "SEQLEN=2e6,8e4")
    code, out, _ = run(*args, "--graph-budget", "2e9", "--json")
    assert code == EXIT_OK
    data = json.loads(out)
    assert data["graph_bytes"]["budget"] == 2e9 and data["graph_bytes"]["peak"] <= 2e9
    assert data["dims"]["SEQLEN"]["peak_graph_bytes"] == data["graph_bytes"]["peak"]
    code, out, _ = run(*args, "--graph-budget", "none")
    assert code == EXIT_OK and "(no bound)" in out and "graph memory: peak" in out
    code, out, _ = run(*args, "--buffer-bytes", "SEQLEN=0,8e4", "--json")
    assert code == EXIT_OK
    buffered = json.loads(out)["graph_bytes"]
    assert 0 < buffered["buffers"]["peak"] <= buffered["peak"] <= buffered["budget"]
    code, out, _ = run(*args, "--json")
    assert code == EXIT_OK
    start = json.loads(out)["graph_bytes"]["budget"]
    code, out, _ = run(*args, "--device-memory", str(400 * start), "--json")
    assert code == EXIT_OK  # the bound is never under 0.5 % of the device's memory
    assert json.loads(out)["graph_bytes"]["budget"] == pytest.approx(2 * start)
    for bad in (("--graph-budget", "lots"), ("--graph-bytes", "SEQLEN=1,2,3"),
                ("--graph-bytes", "NOPE=1"), ("--graph-bytes", "SEQLEN=-1"),
                ("--buffer-bytes", "SEQLEN=1,2,3"), ("--buffer-bytes", "NOPE=1"),
                ("--device-memory", "0"), ("--device-memory", "1e18")):
        code, _, err = run("azure_code_prefill", *bad)
        assert code == EXIT_USAGE and bad[0] in err


def test_a_group_of_ranks_counts_each_step_once_and_decides_as_one_device(tmp_path: Path) -> None:
    trace = _slice(tmp_path, "azure_code_prefill", 1500)  # about ten minutes
    code, alone, _ = run(trace, "--json")
    code2, group, _ = run(trace, "--json", "--ranks", "4")
    assert code == code2 == EXIT_OK
    alone_, group_ = json.loads(alone), json.loads(group)
    assert alone_["updates"] > 0 and alone_["decisions"] == group_["decisions"]
    assert alone_["dims"] == group_["dims"]
    assert run("azure_code_prefill", "--ranks", "0")[0] == 2
