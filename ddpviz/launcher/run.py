"""`ddpviz.launch(fn, nprocs)`: run a notebook-defined function on N ranks and watch them.

The function travels with cloudpickle (plain pickle cannot ship functions defined in a notebook)
over a private pipe to freshly spawned interpreters. One thread per rank ships the call and waits
for the outcome; a supervisor thread stops everyone when a rank fails, when the timeout runs
out, or when the run is stopped, and reaps every process group when the run ends.
"""

from __future__ import annotations

import atexit
import contextlib
import linecache
import os
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cloudpickle

from ddpviz.envvars import ENV_DEBUG, ENV_RING_DIR
from ddpviz.interrupts import interrupts_deferred
from ddpviz.launcher import channel
from ddpviz.launcher.cells import code_origins
from ddpviz.launcher.errors import LaunchError, LaunchTimeout, RankError, RankFailure, _ranks
from ddpviz.launcher.output import OutputTarget, PipeRelay
from ddpviz.launcher.process import (
    RankProcess,
    choose_backend,
    close_fds,
    free_port,
    load_extensions,
    spawn_rank,
    stop_ranks,
)
from ddpviz.launcher.resources import run_resources

if TYPE_CHECKING:
    from ddpviz.findings import Finding
    from ddpviz.session.live import Session
    from ddpviz.traces.trace import Trace
    from ddpviz.widgets.dashboard import Dashboard

_EXIT_GRACE_S = 2.0  # a rank that returned gets this long to exit by itself before SIGTERM
_RELAY_JOIN_S = 2.0
_SOURCES_CAP = 4 << 20  # notebook cell sources shipped for tracebacks, at most this many chars
_live: weakref.WeakSet[Run] = weakref.WeakSet()


def launch(fn: Callable[..., Any], nprocs: int = 2, *, backend: str | None = None,
           args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
           timeout: float | None = None, env: Mapping[str, str] | None = None,
           session: Session | None = None, slow_motion: float | None = None,
           debug: bool | str = False) -> Run:
    """Run `fn(*args, **kwargs)` on `nprocs` ranks of a fresh process group; returns at once.

    Each rank is a new interpreter (spawned, never forked: CUDA-safe) with MASTER_ADDR,
    MASTER_PORT, RANK, WORLD_SIZE and LOCAL_RANK set and `torch.distributed` already
    initialised. Their stdout/stderr appear live in the launching cell, prefixed "[rank r] ".

    Args:
        fn: any function, including one defined in the notebook (shipped with cloudpickle).
        nprocs: number of ranks.
        backend: "gloo" or "nccl"; default NCCL when there is a GPU per rank, else gloo.
        args, kwargs: passed to `fn` on every rank (read the rank from torch.distributed).
        timeout: seconds; ranks still running then are stopped and `wait()` raises
            `LaunchTimeout` (a `TimeoutError`). None: no limit.
        env: extra environment variables for the ranks.
        session: the `Session` (from `ddpviz.listen()`) the ranks' events stream into; by
            default a new one per run, `run.session`. Every rank runs `ddpviz.connect()`, so a
            `ddpviz.DistributedDataParallel` built there reports to it.
        slow_motion: teaching mode: seconds every rank pauses after each event it emits
            (sets DDPVIZ_SLOW_MOTION), so broadcast chunks, hooks and buckets can be watched
            one by one in `run.dashboard()`. None: full speed.
        debug: arm the ranks for the notebook's debugger (sets DDPVIZ_DEBUG=1): they take
            pause/inspect/resume commands from the session (ddpviz/debugger/). Until the first
            command nothing changes; armed, each step costs one store read. "paused": the
            same, and every rank parks before its first forward (step 0), as a debugger starts
            a program stopped: set breaks, then `run.debugger.resume()`.

    Returns:
        A `Run`, at once (the ranks keep running); `run.wait()` gives the per-rank return
        values, `run.stop()` ends every rank.
    """
    if slow_motion is not None:
        if isinstance(slow_motion, bool) or not isinstance(slow_motion, (int, float)) \
                or not slow_motion >= 0:
            raise ValueError(f"ddpviz: slow_motion must be seconds >= 0 or None, got "
                             f"{slow_motion!r}.\nPass e.g. slow_motion=0.2 (a pause after each "
                             "event), or None for full speed.")
        from ddpviz.events import ENV_SLOW_MOTION

        env = {**(env or {}), ENV_SLOW_MOTION: repr(float(slow_motion))}
    if debug not in (True, False, "paused"):
        raise ValueError(f"ddpviz: launch(debug=) is True, False or 'paused', got {debug!r}.\n"
                         "Pass debug=True for ranks that take the debugger's commands, or "
                         "debug='paused' for ranks that also wait before their first step.")
    if debug:
        env = {**(env or {}), ENV_DEBUG: "paused" if debug == "paused" else "1"}
    run = Run(fn, nprocs, backend=backend, args=args, kwargs=kwargs, timeout=timeout, env=env,
              session=session)
    run.debug = bool(debug)
    return run


class Run:
    """N ranks running one function. Created by `ddpviz.launch`."""

    def __init__(self, fn: Callable[..., Any], nprocs: int, *, backend: str | None,
                 args: Sequence[Any], kwargs: Mapping[str, Any] | None,
                 timeout: float | None, env: Mapping[str, str] | None,
                 session: Session | None = None) -> None:
        self.debug = False  # launched with debug=True: the ranks take debugger commands
        self._debugger: Any = None
        load_extensions()
        if not callable(fn):
            raise TypeError(f"ddpviz: launch() needs a function, got {type(fn).__name__}.\n"
                            "Pass the function itself: ddpviz.launch(train, nprocs=2).")
        if not isinstance(nprocs, int) or isinstance(nprocs, bool) or nprocs < 1:
            raise ValueError(f"ddpviz: nprocs must be a positive int, got {nprocs!r}.\n"
                             "Pass the number of ranks, e.g. nprocs=2.")
        if timeout is not None and not timeout > 0:
            raise ValueError(f"ddpviz: timeout must be positive seconds or None, got {timeout!r}."
                             "\nPass e.g. timeout=60, or None for no limit.")
        try:
            payload = cloudpickle.dumps((fn, tuple(args), dict(kwargs or {})))
        except Exception as exc:
            raise LaunchError(
                f"ddpviz: cannot send {getattr(fn, '__name__', fn)!r} or its arguments to the "
                f"ranks: {type(exc).__name__}: {exc}\n"
                "Everything the function uses must be picklable; create locks, open files and "
                "sockets inside the function instead of capturing them."
            ) from exc
        self.nprocs = nprocs
        self.backend = backend or choose_backend(nprocs)
        self.timeout = timeout
        self._target = OutputTarget.capture()
        self._cond = threading.Condition()
        self._outcomes: dict[int, tuple[str, Any]] = {}  # rank -> ("ok", bytes) | ("failed", F)
        self._failures: list[RankFailure] = []
        self._exited: set[int] = set()
        self._stopped: list[int] = []  # ranks we ended before they returned
        self._timed_out: list[int] = []
        self._stop_reason: str | None = None  # "failure" | "timeout" | "stop"
        self._waiters = 0
        self._done = threading.Event()
        self._started = time.monotonic()
        self._ranks: list[RankProcess] = []
        self._relays: list[PipeRelay] = []
        self._timeout_stacks: dict[int, list[str]] = {}
        self._rings: list[Finding] = []  # what the rings show after a failure, unsaid live
        self._dir, self._stacks, self._events = run_resources(nprocs, session)
        port = free_port()
        sources = _cell_sources()
        origins = code_origins(fn)
        try:
            for rank in range(nprocs):
                rank_env = {**(env or {}), **self._events.env, **self._stacks.env(rank),
                            ENV_RING_DIR: str(self._dir.path)}
                with interrupts_deferred():  # a rank is started and known, or not started
                    proc = spawn_rank(rank, nprocs, port=port, store=self._dir.file("store"),
                                      backend=self.backend, mode="call", env=rank_env)
                    self._ranks.append(proc)
                self._relays += [PipeRelay(proc.stdout, rank, "stdout", self._target),
                                 PipeRelay(proc.stderr, rank, "stderr", self._target)]
            with interrupts_deferred():  # the supervisor must exist once the ranks run
                for proc in self._ranks:
                    threading.Thread(target=self._watch, args=(proc, payload, sources, origins),
                                     name=f"ddpviz-rank{proc.rank}", daemon=True).start()
                threading.Thread(target=self._supervise, name="ddpviz-supervisor",
                                 daemon=True).start()
                _live.add(self)
        except BaseException:  # KeyboardInterrupt included: no rank outlives a failed launch
            with interrupts_deferred():
                if self in _live:  # the supervisor runs: it reaps and cleans up
                    self.stop()
                else:
                    stop_ranks(self._ranks, grace=0)
                    self._dir.remove()
                    self._events.close()
            raise

    # --- public -------------------------------------------------------------------------------

    @property
    def debugger(self) -> Any:
        """The debugger of this run's ranks, to pause, inspect and resume them (launch with
        debug=True).

        Returns a `ddpviz.debugger.client.Debugger`, one per run; raises DebuggerError for a
        run launched without debug=True."""
        if not self.debug:
            from ddpviz.debugger.client import DebuggerError

            raise DebuggerError("ddpviz: this run was launched without debug=True, so its ranks "
                                "do not take debugger commands.\nLaunch it again with "
                                "ddpviz.launch(fn, n, debug=True).")
        if self._debugger is None:  # one per run
            from ddpviz.debugger.client import Debugger

            self._debugger = Debugger(self.session, world_size=self.nprocs, finished=self.done)
        return self._debugger

    @property
    def session(self) -> Session:
        """The live `Session` the ranks' events stream into (subscribe, iterate, `.trace`)."""
        return self._events.session

    @property
    def trace(self) -> Trace:
        """Every event received from the ranks so far, per rank."""
        return self._events.session.trace

    @property
    def pids(self) -> list[int]:
        """Process id of each rank (each also leads its own process group)."""
        return [p.pid for p in self._ranks]

    @property
    def returncodes(self) -> list[int | None]:
        """Exit code per rank (None while running; a negative code is the signal that killed it)."""
        return [p.popen.returncode for p in self._ranks]

    @property
    def status(self) -> str:
        """"running", "finished", "failed", "timed out" or "stopped"."""
        if not self._done.is_set():
            return "running"
        return {None: "finished", "failure": "failed", "timeout": "timed out",
                "stop": "stopped"}[self._stop_reason]

    def done(self) -> bool:
        """Whether the run is over: every rank returned, failed or was stopped, and its
        processes were reaped (`status` then says how it ended). Never blocks.

        Returns:
            True once the run is over; `wait()` then returns or raises at once.
        """
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> list[Any]:
        """Block until every rank has finished.

        Args:
            timeout: the most seconds this call waits; None (default): until the run is over.
                It does not limit the ranks (that is `launch(timeout=)`).

        Returns:
            What `fn` returned on each rank, rank 0 first (unpickled in this process).

        Raises:
            RankError: a rank raised or died (names it, with its traceback); the others were
                stopped.
            LaunchTimeout: the launch timeout ran out (a TimeoutError naming the ranks).
            TimeoutError: this wait's own `timeout` ran out; the ranks keep running.
            LaunchError: the run was stopped before every rank returned, or a return value
                cannot be unpickled here.
            KeyboardInterrupt: the kernel was interrupted: every rank is stopped first (their
                stacks are printed), then it propagates.
        """
        with self._cond:
            self._waiters += 1
        try:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not self._done.wait(0.25):
                if deadline is not None and time.monotonic() >= deadline:
                    running = self._running() or list(range(self.nprocs))
                    raise TimeoutError(
                        f"ddpviz: {_ranks(running)} still running after wait(timeout="
                        f"{timeout:g}); they keep running.\n"
                        "Call run.wait() again, or run.stop() to end them.")
        except KeyboardInterrupt:
            with interrupts_deferred():  # a second interrupt must not cut the stop short
                with self._cond:
                    interrupted = [(p.rank, p.pid) for p in self._ranks
                                   if p.rank in self._running()]
                if interrupted and not self._done.is_set():
                    where = self._stacks.take(interrupted)
                    lines = [line for rank in sorted(where) for line in where[rank]]
                    self._target.write("stderr", "ddpviz: interrupted; where each rank was:\n"
                                       + "\n".join(lines) + "\n")
                self.stop()
            raise
        finally:
            with self._cond:
                self._waiters -= 1
        return self._result()

    def stop(self) -> None:
        """End every rank (and anything it started) now: SIGTERM, then SIGKILL; within 5 s."""
        if self._done.is_set():
            return
        with self._cond:
            if self._stop_reason is None:
                self._stop_reason = "stop"
                self._stopped = self._running()
            self._cond.notify_all()
        stop_ranks(self._ranks)
        self._done.wait(5.0)

    def dashboard(self, **kwargs: Any) -> Dashboard:
        """The live Dashboard of this run (see `ddpviz.widgets.dashboard.Dashboard`): the
        events of `session` so far, then new ones as the ranks emit them.

        Args:
            kwargs: passed to the Dashboard (`debugger`, `scheme`, `max_events`, `name`).

        Returns:
            The Dashboard widget (display it as a notebook cell's last value).
        """
        from ddpviz.widgets.dashboard import Dashboard

        return Dashboard(self, **kwargs)

    def __repr__(self) -> str:
        return (f"<ddpviz.Run nprocs={self.nprocs} backend={self.backend!r} "
                f"status={self.status!r} pids={self.pids}>")

    # --- threads ------------------------------------------------------------------------------

    def _running(self) -> list[int]:
        return [p.rank for p in self._ranks if p.rank not in self._outcomes]

    def _watch(self, proc: RankProcess, payload: bytes, sources: dict[str, str],
               origins: dict[str, str]) -> None:
        with contextlib.suppress(OSError):  # a rank that died at start shows up as EOF below
            channel.send(proc.control, ("call", payload, sources, origins))
        try:
            message = channel.recv(proc.results)
            while message is not None and message[0] == "events":
                self._events.shipped(proc.rank, message[1])
                message = channel.recv(proc.results)
        except Exception as exc:
            message = ("error", "exit", type(exc).__name__, f"sent garbage: {exc}", "")
        if message is None:  # EOF: the rank is gone; collect its exit code outside the lock
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(5.0)
        with self._cond:
            if message is None and self._stop_reason is not None:
                pass  # we ended it: it is in _stopped / _timed_out, not a failure
            elif message is not None and message[0] == "ok":
                self._outcomes[proc.rank] = ("ok", message[1])
            else:
                failure = self._failure(proc, message)
                self._outcomes[proc.rank] = ("failed", failure)
                self._failures.append(failure)
                if self._waiters == 0 and len(self._failures) == 1:  # nobody will raise it
                    lines = failure.prefixed() or [f"[rank {proc.rank}] {failure.headline()}"]
                    self._target.write("stderr", "\n".join(lines) + "\n")
            self._cond.notify_all()
        proc.returncode = proc.popen.wait()
        with self._cond:
            self._exited.add(proc.rank)
            self._cond.notify_all()

    def _failure(self, proc: RankProcess, message: tuple[Any, ...] | None) -> RankFailure:
        if message is not None:
            _, phase, exc_type, text, tb = message
            return RankFailure(proc.rank, phase, exc_type, text, tb)
        code = proc.popen.returncode
        if code is None:
            return RankFailure(proc.rank, "exit", "", "closed its pipe before returning", "")
        how = (f"was killed by signal {-code}" if code < 0 else f"exited with code {code}")
        return RankFailure(proc.rank, "exit", "", f"{how} before returning", "")

    def _supervise(self) -> None:
        deadline = None if self.timeout is None else self._started + self.timeout
        to_stop: list[RankProcess] = []
        with self._cond:
            while True:
                running = self._running()
                # failures first: every rank may have failed before this thread woke up (an
                # abort from the debugger ends them all at once), and that run failed
                if self._failures and self._stop_reason is None:
                    self._stop_reason = "failure"
                    self._stopped = running
                    to_stop = [p for p in self._ranks if p.rank in running]
                    break
                if not running and self._stop_reason != "stop":
                    break
                if self._stop_reason == "stop" and len(self._exited) == self.nprocs:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0 and self._stop_reason is None:
                    self._stop_reason = "timeout"
                    self._timed_out = running
                    to_stop = [p for p in self._ranks if p.rank in running]
                    break
                self._cond.wait(left if left is not None else 1.0)
        if to_stop:
            if self._stop_reason == "timeout":
                self._timeout_stacks = self._stacks.take((p.rank, p.pid) for p in to_stop)
            else:
                time.sleep(0.1)  # let the failing rank's last output reach its pipe first
            stop_ranks(to_stop)
        # Every rank has an outcome: give them a moment to exit cleanly, then reap whatever
        # is left in their process groups (grandchildren included).
        with self._cond:
            self._cond.wait_for(lambda: len(self._exited) == self.nprocs, _EXIT_GRACE_S)
        stop_ranks(self._ranks)
        with self._cond:
            self._cond.wait_for(lambda: len(self._exited) == self.nprocs, 5.0)
        for relay in self._relays:
            relay.join(_RELAY_JOIN_S)
        close_fds(*(p.control for p in self._ranks), *(p.results for p in self._ranks))
        rings = _ring_findings(self._dir.path) if self._failures else []
        self._dir.remove()
        self._events.settle()
        if rings and not _said_live(self._events.session):
            self._rings = rings
        self._events.close()
        self._done.set()
        _live.discard(self)

    def _result(self) -> list[Any]:
        if self._failures:
            raise RankError(list(self._failures), self.nprocs, self._hint(),
                            [f.text() for f in self._rings])
        if self._stop_reason == "timeout":
            assert self.timeout is not None
            finished = sorted(r for r in self._outcomes)
            raise LaunchTimeout(self._timed_out, self.timeout, self.nprocs, finished,
                                self._timeout_stacks)
        if self._stop_reason == "stop" and self._stopped:
            raise LaunchError(
                f"ddpviz: the run was stopped before {_ranks(self._stopped)} returned "
                f"(world_size={self.nprocs}).\nLaunch again to rerun it.")
        values = []
        for rank in range(self.nprocs):
            _, data = self._outcomes[rank]
            try:
                values.append(cloudpickle.loads(data))
            except Exception as exc:
                raise LaunchError(
                    f"ddpviz: rank {rank}'s return value cannot be loaded in the kernel: "
                    f"{type(exc).__name__}: {exc}\n"
                    "Return plain data (numbers, lists, dicts, CPU tensors) from the function."
                ) from exc
        return values

    def _hint(self) -> str:
        first = self._failures[0]
        stopped = [r for r in self._stopped if r != first.rank]
        also = f" ({_ranks(stopped)} stopped when rank {first.rank} failed)" if stopped else ""
        if "initialize the default process group twice" in first.message:
            return ("ddpviz.launch already initialised the process group on every rank: remove "
                    f"the init_process_group call from the function{also}.")
        return f"Fix the error on rank {first.rank} and launch again{also}."


def _ring_findings(folder: Path) -> list[Finding]:
    """What the ranks' rings of last collectives in the run's folder show (See [Note: the
    ring], probes/ledger_ring.py): [] when they agree or cannot be read."""
    try:
        from ddpviz.probes.ledger_ring import folder_findings

        return folder_findings(folder)
    except Exception:  # (the ranks' own failure is what counts)
        return []


def _said_live(session: Session) -> bool:
    """Whether a rank named a mismatch of the job's collectives live (its event is in the
    session)."""
    from ddpviz._diagnose.diagnosis import trace_said_live

    try:
        return trace_said_live(session.trace)
    except Exception:
        return False


def _cell_sources() -> dict[str, str]:
    """Source of code that exists only in memory (notebook cells), for the ranks' tracebacks."""
    sources: dict[str, str] = {}
    size = 0
    for filename, entry in list(linecache.cache.items()):
        if len(entry) != 4 or not entry[2] or os.path.exists(filename):
            continue
        text = "".join(entry[2])
        size += len(text)
        if size > _SOURCES_CAP:
            break
        sources[filename] = text
    return sources


@atexit.register
def _stop_all() -> None:
    for run in list(_live):
        run.stop()
