"""`gearshift demo`: adaptive gears against static gears (the default ladder) on a shipped trace."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
from typing import Any, NoReturn

import click

from gearshift.clikit import EXIT_ERROR, EXIT_USAGE, json_option, namespace_option
from gearshift.configfile import load_policy_config
from gearshift.errors import ConfigError, GearshiftError
from gearshift.tools.demo.mix import Mix, load_mix
from gearshift.tools.demo.table import table
from gearshift.tools.demo.workload import DEFAULT_TRACE, LLAMA_TRACE

EXIT_INTERRUPTED = 130  # the shell's code for a run ended by SIGINT


@click.command(
    epilog="Exit status: 0 done; 1 a worker or the controller failed, or the trace cannot be "
    "read; 2 bad options; 130 interrupted (everything started is ended and removed first)."
)
@click.option(
    "--workers",
    default=4,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Worker processes, each running the model.",
)
@click.option(
    "--trace",
    default=None,
    metavar="NAME|PATH|SOURCE",
    help=f"A shipped trace name or a trace CSV (one profile), or a source of two: azure_conv or"
    f" conv, azure_code or code, or DIR/NAME for NAME_prefill.csv and NAME_decode.csv (its"
    f" prefill and decode traces, replayed on one timeline)."
    f"  [default: {DEFAULT_TRACE}; with --model llama: {LLAMA_TRACE}]",
)
@click.option(
    "--seconds",
    default=60.0,
    show_default=True,
    type=click.FloatRange(min=5),
    help="About how long the whole demo takes (start-up and both arms, interleaved).",
)
@click.option(
    "--model",
    "model",
    type=click.Choice(["block", "llama"]),
    default="block",
    show_default=True,
    help="block: the hand-written block below; llama: transformers' LlamaForCausalLM, small and"
    " random (the demo extra): prefills (SEQLEN) and decode steps (BATCHSIZE) of a source, in"
    " each worker, or one trace of either.",
)
@click.option(
    "--backend",
    type=click.Choice(["graphs", "compile"]),
    default="graphs",
    show_default=True,
    help="graphs: each gear a graph of the eager model; compile: each gear a static-shape"
    " torch.compile of it (both arms, one compile cache for the demo: the table says how many"
    " compiles were cold and how many loaded from the cache).",
)
@click.option(
    "--compile-backend",
    type=click.Choice(["inductor", "eager"]),
    default="inductor",
    show_default=True,
    help="With --backend compile: torch.compile's backend (eager: Dynamo only, fast to"
    " compile, no faster to run; for checks).",
)
@click.option(
    "--tp",
    default=1,
    show_default=True,
    type=click.IntRange(1, 64),
    help="Tensor parallel: each worker an instance of TP processes, ranks of one gloo group,"
    " each running its shard of the Llama (--model llama; TP divides its heads).",
)
@namespace_option("Shared-memory namespace of its controller [default: demo-<pid>].")
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="A policy key, in trace seconds (scaled with the time compression).",
)
@json_option('Print one JSON object: {"adaptive", "static", "speedup", ..., "profiles": {NAME:'
             ' the same per profile}}.')
def demo(
    workers: int,
    trace: str | None,
    seconds: float,
    model: str,
    backend: str,
    compile_backend: str,
    tp: int,
    namespace: str | None,
    overrides: tuple[str, ...],
    as_json: bool,
) -> None:
    """Compare adaptive gears with static ones on a model.

    It replays a trace through N workers with static gears, then with adaptive ones.
    N worker processes run a small prefill model on the CPU backend through the adaptive graph
    runner: one pre-norm transformer block over x = [*dims, 16], causal self-attention (one
    head, torch's scaled_dot_product_attention) and a GELU MLP. Its cost grows like
    S H^2 + S^2 H, as prefill's does, so padding costs more than its share of tokens; causal
    attention keeps padded tokens out of the real ones' outputs. The trace (default: the
    shipped Azure conversation trace's prefills, SEQLEN) is replayed with time compressed so
    the demo takes about --seconds: one row in k (k >= 1, maybe fractional) if needed, and
    the policy's windows and intervals stretched by k and divided by the same factor, so that
    a window and a decision round hold as many requests as at the trace's full rate (its
    payback horizon only divided: it prices captures against the rows replayed); the
    controller and the workers' clients run on trace time, and new gears are captured before
    the next request, as if captures took no trace time. The static run keeps the initial
    gears (powers of two below the largest request, and it); the adaptive run starts on them.
    A table compares them: useful tokens per second (wall time, captures of new gears
    included) and per CPU second (workers and controller), padding in tokens and in model
    compute, mean gears, adds and evictions, graph captures, decision rounds, propagation lag
    (in trace time). The table gives padding in percent, --json as ratios (0.25 is 25 %).
    One sentence then says what the workers measured of their graphs and how many additions
    those timings decided; --json has the figures (per profile: `measured_costs`, the fitted
    curves, and `priced_reasons`, the last priced decisions' reasons).

    --model llama runs transformers' LlamaForCausalLM (small, random weights, the demo extra)
    on both profiles of a source in each worker, under one controller (default azure_conv):
    prefills on SEQLEN from its _prefill trace, decode steps of B sequences on BATCHSIZE from
    its _decode trace (a static KV cache per batch size), both traces replayed on one
    timeline, each subsampled by the same k. The table then gives each profile's figures
    against static gears, and the figures over both. A source works with the block too.

    --tp N (with --model llama) makes each worker an instance of N processes, the ranks of
    one gloo process group, each running its shard of the Llama (heads split, all-reduces
    inside each gear's function); rank 0 broadcasts each step's row, and in the adaptive arm
    its plan and the captures and releases every rank runs in lockstep (a grouped profile and
    `GroupRank` per rank). The table adds the steps whose gears differed across ranks
    (all-gathered outside gearshift) and the outputs checked against the unsharded model.

    --backend compile makes each gear of both arms a static-shape torch.compile of the model
    (Inductor by default: `gs.compile`'s backend), compiled where graphs are captured. Both
    arms and every worker share one compile cache of the demo's own, with a lock per shape:
    a shape compiles once, cold, and loads from the cache everywhere else. The table adds
    each arm's compiles before its run (calibration, initial gears) and during it, their
    seconds and how many were cold (FX graph cache misses) or cache hits. --seconds then
    leaves out the start-up (the workers' start and the initial gears' compiles).
    """
    try:
        policy = load_policy_config(None, overrides)
        mix = load_mix(trace or (LLAMA_TRACE if model == "llama" else DEFAULT_TRACE))
    except ConfigError as e:
        _fail(EXIT_USAGE, str(e))
    except GearshiftError as e:
        _fail(EXIT_ERROR, str(e))
    if model == "llama":
        _check_llama(mix)
    if tp > 1:
        _check_tp(tp, model, backend)
    from gearshift.tools.demo.run import Demo  # the controller: not needed for --help

    progress = _Progress(sys.stderr)
    run = Demo(mix, workers, seconds, namespace or f"demo-{os.getpid()}", policy, progress,
               model, compile_backend if backend == "compile" else None, tp)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        result = run.run()
    except KeyboardInterrupt:
        _fail(EXIT_INTERRUPTED, "interrupted; every process and segment it started is gone")
    except GearshiftError as e:
        _fail(EXIT_ERROR, str(e))
    finally:
        signal.signal(signal.SIGTERM, previous)
        progress.end()
    click.echo(json.dumps(result) if as_json else table(result))


def _check_llama(mix: Mix) -> None:
    """A usage error unless `--model llama` can run: the demo extra, every profile's trace of
    one dim, SEQLEN (prefill) or BATCHSIZE (decode steps)."""
    if importlib.util.find_spec("transformers") is None:
        _fail(EXIT_USAGE, "--model llama needs transformers: pip install 'gearshift[demo]'")
    for w in mix.profiles.values():
        dims = list(w.dims)
        if dims not in (["SEQLEN"], ["BATCHSIZE"]):
            _fail(EXIT_USAGE, f"--model llama runs a SEQLEN or a BATCHSIZE trace, or a source of"
                  f" both; {w.trace} has {dims}")


def _check_tp(tp: int, model: str, backend: str) -> None:
    """A usage error unless `--tp` can run: the Llama, eager graphs, TP dividing its heads."""
    if model != "llama" or backend != "graphs":
        _fail(EXIT_USAGE, f"--tp {tp} runs --model llama with --backend graphs only")
    from gearshift.tools.demo.tp import tp_refusal  # torch: only when asked

    why = tp_refusal(tp)
    if why is not None:
        _fail(EXIT_USAGE, why)


def _interrupt(signum: int, frame: object) -> NoReturn:
    """SIGTERM as Ctrl-C; a second one (a supervisor's kill after `timeout`'s) waits for the
    cleanup instead of cutting it short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def _fail(code: int, message: str) -> NoReturn:
    click.echo(f"error: {message}" if code != EXIT_INTERRUPTED else message, err=True)
    sys.exit(code)


class _Progress:
    """The live line on a terminal (rewritten in place), else one line every few seconds."""

    def __init__(self, stream: Any, every: float = 5.0) -> None:
        self.stream, self.every = stream, every
        self.tty = stream.isatty()
        self.due: tuple[str, float] | None = None  # the run shown, when its next line is due
        self.open = False  # a terminal line not ended yet

    def __call__(self, p: Any) -> None:
        new = self.due is None or self.due[0] != p.run
        if not (self.tty or new or p.seconds >= self.due[1]):  # type: ignore[index]
            return
        if new and self.open:
            self.stream.write("\n")  # keep the previous run's last line
        self.due = (p.run, p.seconds + self.every)
        gears = "  ".join(f"{d} {n} gears" for d, n in p.gears.items())
        version = f"  snapshot v{p.version}" if p.version is not None else ""
        line = (
            f"[{p.seconds:6.1f} s] {p.run:8} {p.done:>7,}/{p.total:,} requests  "
            f"{gears}  padding {p.padding:6.1%}{version}"
        )
        self.stream.write(f"\r\x1b[2K{line}" if self.tty else f"{line}\n")
        self.stream.flush()
        self.open = self.tty

    def end(self) -> None:
        if self.open:
            self.stream.write("\n")
            self.open = False
        self.due = None
