"""The compile backend: every variant its own static-shape `torch.compile` specialisation.

A `CompiledRunner` is an `AdaptiveRunner` whose variant graphs record a compiled `fn`: per
variant (one gear per dim) a fresh `torch.compile(dynamic=False)` of a trampoline with a code
object of its own, compiled on the static views of that variant, then captured through the
backend's graph as any variant is (on the cpu the compiled code itself is the graph; on cuda
and npu its replay is recorded as a device graph: compile, then capture). Hence:

- Dynamo keeps its compiled entries per code object, so each variant's trampoline holds one
  entry: no recompile limit (`recompile_limit`, 8 by default) is ever reached however many
  gears there are, and `dynamic=False` keeps automatic dynamic shapes out.
- Releasing a gear drops its variants' graphs, which hold the only references to their
  compiled wrappers: the trampoline, its Dynamo cache entry and guards, and the compiled
  graph go with them (`compiled(variant)` is None after).
- The first attempt is `fullgraph=True`; a graph break makes it fail, and the runner then
  lists the breaks (`torch._dynamo.explain`), logs them once as a warning, keeps them in
  `graph_breaks` and compiles this and later variants with `fullgraph=False` (the parts
  between breaks run eagerly inside the compiled function; nothing is silently left out).
- A function that changes Python state it reads (a request counter: Dynamo guards on its
  value) would recompile on every call, and a graph replay runs none of its Python: each
  compile calls the new function twice on the same inputs, and a second Dynamo entry means
  exactly that. The runner then compiles nothing more and runs every call eagerly on its
  unpadded inputs (`refused`, logged once), where plain torch.compile would fall back to eager
  at its recompile limit. State the caller changes between calls (a module's float attribute)
  recompiles on the cpu's replays; past the limit the variant runs fn itself (`_served`): a
  request never meets Dynamo's recompile-limit error.
- On a device, gearshift's graph is the only one: compile options that make Inductor capture
  device graphs of its own inside it (`mode` "reduce-overhead" or "max-autotune", option
  `triton.cudagraphs`; Dynamo's "cudagraphs" backend) are refused (ConfigError): their
  captures would run inside gearshift's and outside its capture window.
- Compiles run where captures do, on the caller's (the swap) thread, never a request's; the
  compile is timed as part of the capture, so the graph's measured capture seconds include
  it (cold or from Inductor's caches) and reach the controller as any capture's. Each compile
  is also kept in `compiles` (seconds, FX graph cache hits and misses), bounded. A compile
  running past `progress_after` (PROGRESS_SECONDS) is logged once while it runs (a timer
  thread: its gears, input shapes and seconds so far) and once done, at INFO.

Seconds are wall seconds by default (`MonotonicClock`), on every backend: a compile's work
runs partly in other processes (the C++ compiler, Inductor's compile workers) that a
thread's CPU clock does not see.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import logging
import os
import threading
import types
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from gearshift import threads
from gearshift.clock import Clock, MonotonicClock
from gearshift.core.dims import Variant
from gearshift.errors import ConfigError
from gearshift.graphs.adaptive import AdaptiveRunner
from gearshift.graphs.pool import GraphResourcePool
from gearshift.graphs.transform import Transform

log = logging.getLogger(__name__)
MAX_COMPILES = 4096  # compile records kept (the oldest go first)
MAX_BREAKS = 32  # graph-break reasons kept and logged
LOCK_WAIT_SECONDS = 600.0  # the longest wait for another process compiling the same shape
LOCK_POLL_SECONDS = 0.05
CLOSE_WAIT_SECONDS = 600.0  # the longest `close` waits for a compile under way
PROGRESS_SECONDS = 5.0  # a compile running longer is logged once meanwhile, and when done


@dataclass(frozen=True)
class VariantCompile:
    """One variant compiled: its gears (dim -> gear), wall seconds of the compiling call,
    Inductor FX graph cache hits and misses meanwhile, whether it is one full graph, and the
    seconds it first waited for another process compiling the same shape (`lock_dir`)."""

    variant: dict[str, int]
    seconds: float
    cache_hits: int
    cache_misses: int
    fullgraph: bool
    waited: float = 0.0


def _trampoline(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` behind a function with a code object of its own: Dynamo's cache entries (and
    its recompile limit) are per code object, so each variant's are its own."""

    def gear(**tensors: Any) -> Any:
        return fn(**tensors)

    code = gear.__code__.replace()
    return types.FunctionType(code, gear.__globals__, gear.__name__, None, gear.__closure__)


def _fxgraph_counts() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    inductor = counters["inductor"]
    return inductor["fxgraph_cache_hit"], inductor["fxgraph_cache_miss"]


class CompiledRunner(AdaptiveRunner):
    """An adaptive runner whose graphs record `torch.compile`d specialisations of the
    transform's function, one per variant. `mode` and `options` go to `torch.compile` (its
    `backend` too: `compile_backend`, default Inductor); `clock` times captures and
    compiles (default: wall seconds). `lock_dir` (the node's, `worker.compile_cache`): a
    capture first takes the lock file of its shape there, so that of the processes compiling
    one shape at once one compiles and the others load its result from the shared cache
    (waiting at most `lock_wait` seconds, then compiling anyway). `stats` adds compiles,
    compile seconds, FX graph cache hits and misses, graph breaks, and seconds waited."""

    folds_probe = False  # a capture compiles, which no request may wait for (the replay section)

    def __init__(
        self,
        transform: Transform,
        example: Mapping[str, torch.Tensor],
        pool: GraphResourcePool | None = None,
        clock: Clock | None = None,
        replays: int | None = None,
        *,
        mode: str | None = None,
        options: Mapping[str, Any] | None = None,
        compile_backend: str | Callable[..., Any] = "inductor",
        lock_dir: str | os.PathLike[str] | None = None,
        lock_wait: float = LOCK_WAIT_SECONDS,
    ) -> None:
        clock = clock or MonotonicClock()
        super().__init__(transform, example, pool, clock, replays)
        self.clock = clock
        self._options: dict[str, Any] = {"backend": compile_backend, "mode": mode,
                                         "options": None if options is None else dict(options)}
        if self.backend.kind != "cpu":
            _refuse_own_graphs(self.backend.kind, compile_backend, mode, options)
        self.fullgraph = True  # until the first graph break
        self.graph_breaks: list[str] = []
        self.compiles: deque[VariantCompile] = deque(maxlen=MAX_COMPILES)
        self._compiled: weakref.WeakValueDictionary[Variant, Callable[..., Any]] = (
            weakref.WeakValueDictionary())
        self.lock_dir, self.lock_wait = lock_dir, lock_wait
        self.closed = False
        self.progress_after = PROGRESS_SECONDS  # a longer compile: logged once meanwhile
        self._waited = 0.0  # by the capture under way, for its VariantCompile record
        self.stats.update(compiles=0, compile_seconds=0.0, compile_cache_hits=0,
                          compile_cache_misses=0, graph_breaks=0, compile_wait_seconds=0.0)

    def compiled(self, variant: Variant) -> Callable[..., Any] | None:
        """The compiled function of a captured variant (gears in dim order); None once its
        graph is released (or never compiled)."""
        return self._compiled.get(tuple(variant))

    def capture(self, variants: Iterable[Mapping[str, int]]) -> int:
        """As `AdaptiveRunner.capture`; none once closed (0)."""
        return 0 if self.closed else super().capture(variants)

    def close(self, timeout: float = CLOSE_WAIT_SECONDS) -> bool:
        """Start no compile from now on and wait (at most `timeout` seconds) for the one under
        way, so that the process may exit (a thread left inside a compile at exit may abort
        it); the graphs stay. False if the compile under way outlasted `timeout`."""
        self.closed = True
        if not self._capture_lock.acquire(timeout=timeout):
            return False
        self._capture_lock.release()
        return True

    def _capture(self, gears: Variant) -> Any:
        try:
            with self._shape_lock(gears):  # its wait is not part of the measured capture
                return super()._capture(gears)
        except PythonState as e:  # no graph can run it: every call eagerly from now on
            self.refused = str(e)
            log.warning("%s", e)
            return None

    @contextlib.contextmanager
    def _shape_lock(self, gears: Variant) -> Iterator[None]:
        """Hold the lock file of this shape in `lock_dir` while compiling it, unless its marker
        says a process has compiled it already (then load it beside the others); mark it once
        compiled. No lock without `lock_dir` or when it cannot be opened (logged)."""
        self._waited = 0.0
        key = self._shape_key(gears) if self.lock_dir is not None else ""
        opened = self._open_lock(key) if key else None
        if opened is None:
            yield
            return
        dir_fd, fd = opened
        try:
            held = not _exists(f"{key}.done", dir_fd) and self._wait_for(fd, gears)
            if held and _exists(f"{key}.done", dir_fd):  # compiled while this one waited
                fcntl.flock(fd, fcntl.LOCK_UN)
                held = False
            yield
            if held:
                os.close(os.open(f"{key}.done", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW
                                 | os.O_CLOEXEC, 0o600, dir_fd=dir_fd))
        finally:
            os.close(fd)  # and the lock with it
            os.close(dir_fd)

    def _wait_for(self, fd: int, gears: Variant) -> bool:
        """Take `fd`'s lock, polling for at most `lock_wait`; False if it never came."""
        began, got = self.clock.now(), True
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if self.clock.now() - began >= self.lock_wait:
                    log.warning("waited %.0f s for another process compiling %s; compiling it"
                                " here too", self.lock_wait, gears)
                    got = False
                    break
                self.clock.sleep(LOCK_POLL_SECONDS)
        self._waited = max(self.clock.now() - began, 0.0)
        with self._count_lock:
            self.stats["compile_wait_seconds"] += self._waited
        return got

    def _shape_key(self, gears: Variant) -> str:
        """The same in every process compiling this function at these gears, shapes and
        dtypes on this device, with these options."""
        fn = self.transform.fn
        name = getattr(fn, "__qualname__", None) or type(fn).__qualname__  # a module: its class
        at = dict(zip(self.names, gears, strict=True))
        shapes = sorted((n, tuple(s if s is not None else at[d] for d, s in
                                  zip(self.transform.inputs[n], shape, strict=True)),
                         str(self._staged.dtypes[n])) for n, shape in self._staged.shapes.items())
        what = (getattr(fn, "__module__", None), name, str(self.device), shapes,
                repr(sorted(self._options.items())), torch.__version__)
        return hashlib.sha256(repr(what).encode()).hexdigest()[:40]

    def _open_lock(self, key: str) -> tuple[int, int] | None:
        """The lock directory's descriptor and the shape's lock file's (made 0600, no link
        followed, this user's); None (logged) if they cannot be opened."""
        assert self.lock_dir is not None
        dir_fd = fd = None
        try:
            dir_fd = os.open(self.lock_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            fd = os.open(f"{key}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=dir_fd)
            if os.fstat(fd).st_uid != os.geteuid():
                raise PermissionError(f"{key}.lock is another user's")
            return dir_fd, fd
        except OSError as e:
            for opened in (fd, dir_fd):
                if opened is not None:
                    os.close(opened)
            log.warning("compiling without the shape lock in %s: %r", self.lock_dir, e)
            return None

    def _graph_fn(self, gears: Variant, inputs: dict[str, torch.Tensor],
                  lengths: dict[str, torch.Tensor]) -> Callable[[], Any]:
        return self._compile(gears, {**inputs, **self._unbound, **lengths})

    def _compile(self, gears: Variant, tensors: dict[str, torch.Tensor]) -> Callable[[], Any]:
        """A fresh static-shape compile of `fn` on `tensors` (the variant's static views),
        compiled now by one call; full graph unless a break was met."""
        hits, misses = _fxgraph_counts()
        began = self.clock.now()
        what = self._described(gears, tensors)
        timer = threading.Timer(self.progress_after, self._still, (what, began))
        timer.daemon = True
        threads.start(timer)
        fn = None
        try:
            if self.fullgraph:
                try:
                    fn = self._compiled_call(tensors, fullgraph=True)
                except torch._dynamo.exc.Unsupported as e:
                    self._broke(tensors, e)
            if fn is None:
                fn = self._compiled_call(tensors, fullgraph=False)
        finally:
            timer.cancel()
        seconds = max(self.clock.now() - began, 0.0)
        if seconds >= self.progress_after:
            log.info("compiled %s in %.1f s", what, seconds)
        hit, miss = (a - b for a, b in zip(_fxgraph_counts(), (hits, misses), strict=True))
        self.compiles.append(VariantCompile(dict(zip(self.names, gears, strict=True)), seconds,
                                            hit, miss, self.fullgraph, self._waited))
        self._compiled[gears] = fn
        with self._count_lock:
            s = self.stats
            s["compiles"] += 1
            s["compile_seconds"] += seconds
            s["compile_cache_hits"] += hit
            s["compile_cache_misses"] += miss
        return functools.partial(_served, fn, self.transform.fn, tensors)

    def _described(self, gears: Variant, tensors: Mapping[str, torch.Tensor]) -> str:
        """A compile's gears and input shapes, as its progress lines name them."""
        fn = self.transform.fn
        name = getattr(fn, "__qualname__", None) or type(fn).__name__
        at = ", ".join(f"{d}={g}" for d, g in zip(self.names, gears, strict=True))
        shapes = ", ".join(f"{n} {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')}"
                           for n, t in tensors.items())
        return f"{name} at {at} ({shapes})"

    def _still(self, what: str, began: float) -> None:
        """The progress line of a compile that runs past `progress_after` (a timer's)."""
        log.info("compiling %s: %.0f s so far (requests run on a larger gear, or eagerly,"
                 " meanwhile)", what, max(self.clock.now() - began, 0.0))

    def _compiled_call(self, tensors: dict[str, torch.Tensor], fullgraph: bool) -> Any:
        """A compiled trampoline of fn, compiled by a call on `tensors` and called once more:
        PythonState if that second call compiled it again (its guards failed on the same
        inputs: fn changed Python state it reads, a counter or a global)."""
        gear = _trampoline(self.transform.fn)
        fn = torch.compile(gear, dynamic=False, fullgraph=fullgraph, **self._options)
        with self.transform.mode():  # as graphs capture and replay: one grad-mode guard
            fn(**tensors)
            fn(**tensors)
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list

        if len(_debug_get_cache_entry_list(gear.__code__)) > 1:
            raise PythonState(_changes_state(self.transform.fn))
        return fn

    def _broke(self, tensors: dict[str, torch.Tensor], error: Exception) -> None:
        """A graph break under fullgraph: list the breaks, warn once, compile with breaks."""
        self.fullgraph = False
        try:
            with self.transform.mode():
                explained = torch._dynamo.explain(_trampoline(self.transform.fn))(**tensors)
            reasons = [str(getattr(b, "reason", b)) for b in explained.break_reasons]
        except Exception as e:  # the explanation is a courtesy: the error says the first one
            reasons = [f"{error}".splitlines()[0], f"(explain failed: {e!r})"]
        self.graph_breaks = [r.splitlines()[0][:300] for r in reasons[:MAX_BREAKS]] or [
            f"{error}".splitlines()[0]]
        self.stats["graph_breaks"] = len(reasons)
        log.warning(
            "%r has %d graph break(s); it is compiled with them (fullgraph=False: the code"
            " between breaks runs eagerly inside each gear's compiled function): %s",
            self.transform.fn, len(reasons), "; ".join(self.graph_breaks),
        )


def _served(compiled: Callable[..., Any], fn: Callable[..., Any],
            tensors: Mapping[str, torch.Tensor]) -> Any:
    """A variant's compiled function on its static tensors; fn itself once Dynamo, its guards
    failing call after call (state the caller changes: a module's float attribute), reaches
    its recompile limit, as plain torch.compile runs it: never an error into a request."""
    try:
        return compiled(**tensors)
    except torch._dynamo.exc.FailOnRecompileLimitHit:
        return fn(**tensors)


class PythonState(RuntimeError):
    """fn changes Python state it reads: no compiled graph can replay it."""


def _changes_state(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    return (f"{name} changes Python state that it reads (a request counter, a global, an"
            f" attribute): compiled, a second call on the same inputs no longer matched its"
            f" guards, and a graph replays none of its Python; so it is not compiled, and every"
            f" call runs it eagerly on its unpadded inputs from now on (as torch.compile falls"
            f" back to eager past its recompile limit). Keep such state outside fn")


def _refuse_own_graphs(kind: str, compile_backend: str | Callable[..., Any], mode: str | None,
                       options: Mapping[str, Any] | None) -> None:
    """ConfigError (naming the key) if compiling with these settings makes device graphs of
    its own, which gearshift's capture of the compiled function on `kind` would enclose."""
    if compile_backend == "cudagraphs":
        raise ConfigError("compile_backend", f"Dynamo's 'cudagraphs' backend captures device"
                          f" graphs of its own; on {kind} gearshift captures each compiled gear"
                          f" itself: use 'inductor' (the default) or another backend")
    if compile_backend != "inductor":
        return
    from torch._inductor import list_mode_options

    mode_options = list_mode_options(mode) if mode is not None else {}
    if mode_options.get("triton.cudagraphs"):
        raise ConfigError("mode", f"mode {mode!r} makes Inductor capture device graphs of its"
                          f" own; on {kind} gearshift captures each compiled gear itself: use"
                          f" the default mode, or 'max-autotune-no-cudagraphs'")
    if (options or {}).get("triton.cudagraphs"):
        raise ConfigError("options", f"triton.cudagraphs makes Inductor capture device graphs"
                          f" of its own; on {kind} gearshift captures each compiled gear"
                          f" itself: leave it off")


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True
