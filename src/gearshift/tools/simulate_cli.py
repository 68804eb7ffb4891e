"""`gearshift simulate`: replay a trace through a gear policy and report padding and churn."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from typing import Any, NoReturn

import click

from gearshift.clikit import EXIT_ERROR, EXIT_USAGE, config_options, json_option
from gearshift.configfile import load_policy_config
from gearshift.core.group import MAX_GROUP_SIZE
from gearshift.errors import ConfigError, GearshiftError, TraceError
from gearshift.tools import simulate as replay
from gearshift.tools import simulate_options as options
from gearshift.tools.simulate_fleet import report
from gearshift.tools.simulate_plot import figure
from gearshift.tools.trace import load_trace


@click.command(
    epilog="Exit status: 0 done; 1 the trace cannot be read or the plot not written; "
    "2 bad options, gears or config."
)
@click.argument("trace")
@click.option(
    "--policy",
    type=click.Choice(replay.POLICIES),
    default="adaptive",
    show_default=True,
    help="adaptive: the policy, from the initial gears; static: the initial gears "
    "kept; pow2: the power-of-two ladder below the trace's largest value, and it (where "
    "the adaptive start ends); optimal: the "
    "hindsight-optimal K gears per dim.",
)
@click.option(
    "--gears",
    multiple=True,
    metavar="DIM=G1,G2,...",
    help="Initial gears of DIM (adaptive, static). Default: the powers of two below "
    "the dim's largest value in the trace, plus that value.",
)
@click.option(
    "--k",
    multiple=True,
    metavar="K|DIM=K",
    help="Gear count of every dim, or of DIM, for --policy optimal. Default: as "
    "many as the default gears.",
)
@click.option(
    "--splittable",
    multiple=True,
    metavar="DIM=yes|no",
    help="Whether DIM runs in chunks over its largest gear (yes) or eager (no). "
    "Default: yes for BATCHSIZE, no for any other dim.",
)
@click.option(
    "--cost",
    multiple=True,
    metavar="DIM=C0,C1,...",
    help="What a chunk of DIM costs, polynomial coefficients in its size, lowest first "
    "(Dim.cost): the policy and the optimum minimise padded cost, reported as "
    "cost_overhead. Default 0,1: the size itself.",
)
@click.option(
    "--capture-seconds",
    "capture",
    metavar="A[,B]",
    help="What capturing a gear costs, A + B x gear seconds on each worker: reported as "
    "device_overhead = (padded cost + captures) / raw cost - 1, with --cost in seconds, and the "
    "adaptive policy prices its moves by it (--unpriced: not). The static policies capture "
    "their gears once, at the start.",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 4096),
    default=1,
    show_default=True,
    help="Workers of the device: each captures every gear added.",
)
@click.option(
    "--unpriced",
    is_flag=True,
    help="With --capture-seconds: the policy decides on padding alone (as without it), and "
    "captures are only counted.",
)
@click.option(
    "--eager-start",
    is_flag=True,
    help="With --capture-seconds: the adaptive policy's initial gears are all captured at the "
    "start (default: each the first time traffic reaches it, as a worker does).",
)
@click.option(
    "--graph-bytes",
    "graph_bytes",
    multiple=True,
    metavar="DIM=A[,B]",
    help="What a graph of DIM holds, A + B x gear bytes on each worker (default: 2 MiB a "
    "graph, the model of unmeasured graphs): reported as peak and time-weighted graph bytes, "
    "and priced, the adaptive policy keeps them within its memory bound.",
)
@click.option(
    "--buffer-bytes",
    "buffer_bytes",
    multiple=True,
    metavar="DIM=A[,B]",
    help="The static input buffers the graphs share, A + B x the largest gear of DIM bytes on "
    "each worker, counted once (default: none): in the graph bytes reported, and priced, in "
    "the memory bound and what the gears hold under it, as a worker's reported buffers are.",
)
@click.option(
    "--graph-budget",
    metavar="BYTES|RATIOx|none",
    help="The priced policy's graph memory bound: BYTES (graph_memory_budget_bytes), RATIOx "
    "times the start-up gears' bytes (graph_memory_budget_ratio; default 1.25x, at least 2 "
    "graphs of the largest start-up gear), or none (unbounded).",
)
@click.option(
    "--device-memory",
    "device_memory",
    type=float,
    metavar="BYTES",
    help="The device's memory, as its workers report it: the priced policy's bound is never "
    "under graph_memory_floor_ratio (0.5 %) of it (default: unknown, no such floor).",
)
@click.option("--fleet", type=click.IntRange(2, 64), metavar="N",
              help="Split the trace across N nodes joining 600 s apart that share a fleet "
              "(docs/architecture.md, \"Fleet\"): the last node's overhead with the fleet "
              "and cold, against the fleet's steady state.")
@click.option(
    "--ranks",
    type=click.IntRange(1, MAX_GROUP_SIZE),
    default=1,
    show_default=True,
    help="Replay as one group of this many ranks (tensor parallel: every rank serves every "
    "step, each on a device alike), decided as the controller decides a group.",
)
@config_options("policy", "at top level or under [policy]")
@json_option()
@click.option(
    "--plot",
    metavar="OUT.png",
    help="Also write gears and padding over time to OUT.png, one column per dim, every gear "
    "labelled, spans without requests shaded (needs the plot extra: pip install "
    "'gearshift[plot]'; checked before the replay).",
)
def simulate(
    trace: str,
    policy: str,
    gears: tuple[str, ...],
    k: tuple[str, ...],
    splittable: tuple[str, ...],
    cost: tuple[str, ...],
    capture: str | None,
    workers: int,
    unpriced: bool,
    eager_start: bool,
    graph_bytes: tuple[str, ...],
    buffer_bytes: tuple[str, ...],
    graph_budget: str | None,
    device_memory: float | None,
    fleet: int | None,
    ranks: int,
    config_path: str | None,
    overrides: tuple[str, ...],
    as_json: bool,
    plot: str | None,
) -> None:
    """Replay a trace through a gear policy in virtual time.

    TRACE is a CSV path or a shipped trace name.
    The trace runs in virtual time with the controller's cadence: the policy is
    checked every check_interval_seconds of trace time. Each column is one dim
    with bounds [1, its largest value]. Reports, per
    dim, padding_overhead = padded work / raw work - 1 (a split request's padded
    work is the sum of its chunks' gears, an eager one's its raw size),
    cost_overhead (the same in the dim's --cost), mean_gears (time-weighted), final
    gears, adds, evictions, churn per hour, split and eager events; --json also lists
    every decision with its reason. The table gives the overheads in percent, --json as
    ratios (0.25 is 25 %).
    """
    began = time.perf_counter()
    if fleet and ranks > 1:
        _fail(ConfigError("--ranks", "--fleet replays ungrouped nodes: drop --ranks or --fleet"),
              EXIT_USAGE)
    if plot:
        _pyplot()  # before the replay: a missing extra fails at once
    try:
        config = options.budget(load_policy_config(config_path, overrides), graph_budget)
        data = load_trace(trace)
        dims = replay.policy_dims(data, policy, options.gears(gears), options.counts(k, data),
                                  options.splittable(splittable), options.costs(cost))
        adaptive = policy == "adaptive"
        device = options.device(capture, workers, adaptive and not unpriced,
                                adaptive and not eager_start)
        device = dataclasses.replace(
            device, bytes=options.graph_lines(graph_bytes, data),
            buffers=options.graph_lines(buffer_bytes, data, "--buffer-bytes"),
            memory=options.device_memory(device_memory))
        if fleet:
            return click.echo(report(data, dims, config, fleet, device, policy, as_json))
    except TraceError as e:
        _fail(e, EXIT_ERROR)
    except GearshiftError as e:
        _fail(e, EXIT_USAGE)
    result = replay.simulate(data, dims, config, adaptive=adaptive, device=device, ranks=ranks)
    wall = time.perf_counter() - began
    summary = result.summary()
    if as_json:
        head = {
            "trace": data.name,
            "policy": policy,
            "events": data.events,
            "updates": result.updates,
            "wall_seconds": wall,
        }
        click.echo(json.dumps({**head, **summary}))
    else:
        click.echo(_table(result, summary["dims"], policy, wall, priced=bool(cost),
                          captured=capture is not None))
        click.echo(_memory(result))
    if plot:
        _plot(result, plot)
        click.echo(f"wrote gears and padding over time to {plot}", err=True)


def _fail(error: Exception, code: int) -> NoReturn:
    click.echo(f"error: {error}", err=True)
    sys.exit(code)


def _table(
    result: replay.SimulationResult, dims: dict, policy: str, wall: float, priced: bool,
    captured: bool = False,
) -> str:
    lines = [
        f"{result.trace}: {policy}, {result.events} events over {result.duration / 60:.1f} min, "
        f"{result.updates} updates, {len(result.changes)} changes, {wall:.2f} s",
        f"{'dim':<12}{'padding':>9}{'cost pad' if priced else '':>9}"
        + (f"{'device':>9}{'captures':>10}" if captured else "")
        + f"{'mean gears':>12}{'adds':>6}"
        f"{'evicts':>8}{'churn/h':>9}{'split':>7}{'eager':>7}  final gears",
    ]
    for name, d in dims.items():
        cost = f"{d['cost_overhead']:>9.2%}" if priced else f"{'':>9}"
        if captured:
            cost += f"{d['device_overhead']:>9.2%}{d['capture_seconds']:>9.1f}s"
        lines.append(
            f"{name:<12}{d['padding_overhead']:>9.2%}{cost}{d['mean_gears']:>12.2f}{d['adds']:>6}"
            f"{d['evictions']:>8}{d['churn_per_hour']:>9.1f}{d['split_events']:>7}"
            f"{d['eager_events']:>7}  {','.join(map(str, d['final_gears']))}"
        )
    return "\n".join(lines)


def _memory(result: replay.SimulationResult) -> str:
    """One line: the graph bytes held (peak, time-weighted mean; with the buffers, where
    modelled) against the bound."""
    budget = "no bound" if result.budget is None else f"bound {_mib(result.budget)}"
    buffers = ("" if result.segment_buffers is None
               else f", buffers peak {_mib(result.peak_buffers)} of it")
    return (f"graph memory: peak {_mib(result.peak_bytes)}, mean {_mib(result.mean_bytes)}"
            f"{buffers} ({budget})")


def _mib(n: float) -> str:
    return f"{n / (1 << 20):,.1f} MiB"


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend; exit status 1 without the plot extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _fail(RuntimeError("--plot needs matplotlib: pip install 'gearshift[plot]'"), EXIT_ERROR)
    return plt


def _plot(result: replay.SimulationResult, path: str) -> None:
    plt = _pyplot()
    fig = figure(result)
    try:
        fig.savefig(path)
    except OSError as e:
        _fail(e, EXIT_ERROR)
    finally:
        plt.close(fig)
