"""Long-lived ranks for the %%ddp magic: each keeps a namespace that lives across cells.

The cell's source text (never a pickle) goes to every rank, which executes it in its own
`__main__` namespace (see rank.py). A rank writes an end marker on stdout and stderr after each
cell, so the cell returns only once all its output is shown. A rank that raises leaves the pool
running (its state and the others' are kept); a rank that dies, a timeout or an interrupt stops
the whole pool, and the next cell starts a fresh one.

With the debugger on (`debug=True`, `%%ddp --debug`) a cell also returns once every rank has
parked in it: the cell stays the pool's parked cell (no other is run) until the debugger
(pool_debugger.py) resumes it, which collects the rest here (`continue_cell`), or aborts it.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import linecache
import queue
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ddpviz.envvars import ENV_DEBUG
from ddpviz.interrupts import interrupts_deferred
from ddpviz.launcher import channel
from ddpviz.launcher.errors import (
    CellParked,
    LaunchError,
    LaunchTimeout,
    RankError,
    RankFailure,
    _ranks,
)
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
from ddpviz.launcher.rank import CELL_END
from ddpviz.launcher.resources import run_resources

if TYPE_CHECKING:
    from ddpviz.debugger.stop import Stop
    from ddpviz.launcher.pool_debugger import PoolDebugger
    from ddpviz.session.live import Session

_MARKER_WAIT_S = 2.0  # after a rank's reply, how long its cell's output may still trail
_live: weakref.WeakSet[RankPool] = weakref.WeakSet()
_cell_numbers = itertools.count(1)


@dataclass(frozen=True)
class CellResult:
    """What each rank's last expression evaluated to (repr), for the ranks that returned one;
    `parked`: where every rank stopped when the cell returned parked (the debugger), else None."""

    values: dict[int, str]
    parked: Stop | None = None


@dataclass
class _Cell:
    """The cell the ranks are executing (between run_cell and its end, parks included)."""

    id: str
    name: str  # as tracebacks name it: <ddp-cell-N>
    timeout: float | None
    parked: Stop | None = None


class RankPool:
    """`nprocs` rank processes in one process group, executing cell sources on request."""

    def __init__(self, nprocs: int, backend: str | None = None,
                 env: Mapping[str, str] | None = None, session: Session | None = None,
                 debug: bool = False) -> None:
        load_extensions()
        self.nprocs = nprocs
        self.debug = bool(debug)  # the ranks take debugger commands (DDPVIZ_DEBUG=1)
        self.debugger: PoolDebugger | None = None
        self._cell: _Cell | None = None
        if debug:
            env = {**(env or {}), ENV_DEBUG: "1"}
        self.backend = backend or choose_backend(nprocs)
        self._messages: queue.Queue[tuple[int, Any]] = queue.Queue()
        self._markers: set[tuple[int, str, str]] = set()
        self._marker_cond = threading.Condition()
        self._ready: set[int] = set()
        self._closed = False
        self._ranks: list[RankProcess] = []
        self._relays: list[PipeRelay] = []
        target = OutputTarget.capture()
        self._dir, self._stacks, self._events = run_resources(nprocs, session)
        port = free_port()
        try:
            for rank in range(nprocs):
                rank_env = {**(env or {}), **self._events.env, **self._stacks.env(rank)}
                with interrupts_deferred():  # a rank is started and known, or not started
                    proc = spawn_rank(rank, nprocs, port=port, store=self._dir.file("store"),
                                      backend=self.backend, mode="cells", env=rank_env)
                    self._ranks.append(proc)
                for name, fd in (("stdout", proc.stdout), ("stderr", proc.stderr)):
                    on_marker = functools.partial(self._marker, rank, name)
                    self._relays.append(PipeRelay(fd, rank, name, target, on_marker=on_marker,
                                                  marker_prefix=CELL_END))
            with interrupts_deferred():
                for proc in self._ranks:
                    threading.Thread(target=self._pump, args=(proc,),
                                     name=f"ddpviz-pool{proc.rank}", daemon=True).start()
                _live.add(self)
            if debug:
                from ddpviz.launcher.pool_debugger import PoolDebugger

                self.debugger = PoolDebugger(self)
                # a park (or a leave) wakes the running cell's collection to check
                self.debugger.on_change(lambda: self._messages.put((-1, ("debugger",))))
        except BaseException:  # KeyboardInterrupt included: no rank outlives a failed start
            with interrupts_deferred():
                self.stop()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._ranks]

    @property
    def session(self) -> Session:
        """The live `Session` the ranks' events stream into."""
        return self._events.session

    @property
    def alive(self) -> bool:
        return not self._closed

    @property
    def parked(self) -> Stop | None:
        """Where every rank stopped in the parked cell (None: no cell is parked)."""
        cell = self._cell
        return None if cell is None else cell.parked

    def check_not_parked(self) -> None:
        """Raise `CellParked`, saying how to go on, while a cell is parked."""
        cell = self._cell
        if cell is not None and not self._closed:
            from ddpviz.launcher.pool_debugger import parked_refusal

            raise CellParked(parked_refusal(cell.parked, cell.name))

    def run_cell(self, source: str, *, timeout: float | None = None) -> CellResult:
        """Execute `source` on every rank; output appears live, prefixed by rank.

        Raises:
            RankError: some ranks raised (the pool keeps running) or a rank died (the pool is
                stopped).
            LaunchTimeout: ranks still running after `timeout`; the pool is stopped.
        KeyboardInterrupt stops the pool, then propagates.
        """
        if self._closed:
            raise LaunchError("ddpviz: this rank pool was stopped.\n"
                              "Run the cell again: %%ddp starts a fresh pool.")
        self.check_not_parked()
        target = self._retarget()
        number = next(_cell_numbers)
        cell_id = str(number)
        filename = f"<ddp-cell-{number}>"
        # the kernel knows the cell's lines too: for the stacks of ranks stopped in it
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        # the rank starts the cell once the debugger's commands sent before it have arrived
        after = self.debugger.sent_to_all if self.debugger is not None else 0
        for proc in self._ranks:
            # a rank that died cannot take it: its EOF is already queued, reported below
            with contextlib.suppress(OSError):
                channel.send(proc.control, ("exec", cell_id, source, filename, after))
        cell = self._cell = _Cell(cell_id, filename, timeout)
        return self._run(cell, target)

    def continue_cell(self) -> CellResult:
        """Collect the rest of the parked cell, which the debugger let the ranks go on with:
        blocks until they finish it or park again; output appears in the current cell.

        Raises:
            As `run_cell`.
        """
        cell = self._cell
        if cell is None or self._closed:
            raise LaunchError("ddpviz: no %%ddp cell is parked on these ranks; nothing to go "
                              "on with.")
        cell.parked = None
        return self._run(cell, self._retarget())

    def end_aborted(self, timeout: float) -> None:
        """After the debugger's abort: wait up to `timeout` s for every rank to leave the
        parked cell (raising Aborted, its events shipped), then stop the pool."""
        cell, target = self._cell, self._retarget()
        stop = None if cell is None else cell.parked
        if cell is not None:
            left_cell: set[int] = set()
            deadline = time.monotonic() + timeout
            while len(left_cell) < self.nprocs and time.monotonic() < deadline:
                try:
                    rank, message = self._messages.get(timeout=0.1)
                except queue.Empty:
                    continue
                if rank < 0:
                    continue
                if message is None or message[0] == "error":
                    left_cell.add(rank)
                elif message[0] == "events":
                    self._events.shipped(rank, message[1])
                elif message[0] == "done" and message[1] == cell.id:
                    left_cell.add(rank)
            self._events.settle(min(timeout, 5.0))
        pids = self.pids
        self.stop()
        from ddpviz.launcher.pool_debugger import aborted_text

        target.write("stdout", aborted_text(stop, self.nprocs, pids))

    def output_here(self) -> None:
        """From now on the ranks' output goes to the cell (or widget output) running now: the
        debugger calls it before it lets parked ranks go on, so none of their lines lands in
        the cell they parked in."""
        self._retarget()

    def _retarget(self) -> OutputTarget:
        """The ranks' output goes to the cell running now."""
        target = OutputTarget.capture()
        for relay in self._relays:
            relay.retarget(target)
        return target

    def _run(self, cell: _Cell, target: OutputTarget) -> CellResult:
        """Collect `cell` until it ends (the pool forgets it) or every rank parks in it."""
        try:
            result = self._collect(cell.id, target, cell.timeout)
        except KeyboardInterrupt:
            self._cell = None
            where = self._stacks.take((p.rank, p.pid) for p in self._ranks)
            lines = [line for rank in sorted(where) for line in where[rank]]
            target.write("stderr", "ddpviz: interrupted; where each rank was:\n"
                         + "\n".join(lines) + "\n")
            with interrupts_deferred():  # a second interrupt must not cut the stop short
                self.stop()
            raise
        except BaseException:
            self._cell = None
            raise
        if result.parked is None:
            self._cell = None
        else:
            from ddpviz.launcher.pool_debugger import parked_text

            cell.parked = result.parked
            target.write("stdout", parked_text(result.parked, cell.name))
        return result

    def _all_parked(self) -> Stop | None:
        """Where every rank is parked at one agreed point, or None."""
        stop = None if self.debugger is None else self.debugger.stop
        if stop is None or not stop.agreed or len(stop.ranks) < self.nprocs:
            return None
        return stop

    def _collect(self, cell_id: str, target: OutputTarget, timeout: float | None) -> CellResult:
        # The clock starts once every rank is up: a fresh pool's start-up is not the cell's.
        def start_clock() -> float | None:
            ready = len(self._ready) == self.nprocs
            return None if timeout is None or not ready else time.monotonic() + timeout

        deadline = start_clock()
        values: dict[int, str] = {}
        failures: list[RankFailure] = []
        finished: set[int] = set()
        crashed = False
        while len(finished) < self.nprocs:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                running = sorted(set(range(self.nprocs)) - finished)
                where = self._stacks.take((r, self._ranks[r].pid) for r in running)
                self.stop()
                assert timeout is not None
                raise LaunchTimeout(running, timeout, self.nprocs, sorted(finished), where)
            try:
                rank, message = self._messages.get(timeout=min(0.25, left or 0.25))
            except queue.Empty:
                continue
            if rank < 0:  # the debugger: a rank parked or left its park
                stop = self._all_parked()
                if stop is not None and not finished:
                    self._events.settle()
                    self._output_caught_up()
                    return CellResult(values, parked=stop)
                continue
            if message is None or message[0] == "error":  # died, or failed to start
                failure = self._exit_failure(rank, message)
                failures.append(failure)
                finished.add(rank)
                crashed = True
                break
            if message[0] == "events":
                self._events.shipped(rank, message[1])
                continue
            if message[0] == "ready":
                self._ready.add(rank)
                deadline = start_clock()
                continue
            _, done_id, ok, payload = message
            if done_id != cell_id:
                continue
            finished.add(rank)
            if ok:
                if payload is not None:
                    values[rank] = payload
            else:
                _, phase, exc_type, text, tb = payload
                failures.append(RankFailure(rank, phase, exc_type, text, tb))
                waiting = sorted(set(range(self.nprocs)) - finished)
                if waiting:
                    target.write("stderr", f"[rank {rank}] raised {exc_type}: {text}; still "
                                 f"waiting for {_ranks(waiting)} (interrupt the kernel to stop "
                                 "the pool)\n")
        if crashed:
            running = sorted(set(range(self.nprocs)) - finished)
            time.sleep(0.1)  # let the dead rank's last output reach its pipe
            self.stop()
            hint = ("The pool was stopped; the next %%ddp cell starts fresh ranks "
                    "(variables from earlier cells are gone).")
            if running:
                hint = f"{_ranks(running)} stopped too. " + hint
            raise RankError(failures, self.nprocs, hint)
        self._wait_markers(cell_id)
        self._events.settle()
        for rank, text in sorted(values.items()):
            target.write("stdout", f"[rank {rank}] Out: {text}\n")
        if failures:
            raise RankError(sorted(failures, key=lambda f: f.rank), self.nprocs,
                            "The pool keeps running with every rank's state; fix the cell and "
                            "run it again.")
        return CellResult(values)

    def _exit_failure(self, rank: int, message: Any) -> RankFailure:
        if message is not None:
            _, phase, exc_type, text, tb = message
            return RankFailure(rank, phase, exc_type, text, tb)
        proc = self._ranks[rank]
        with contextlib.suppress(Exception):
            proc.popen.wait(5.0)
        code = proc.popen.returncode
        how = ("closed its pipe" if code is None else
               f"was killed by signal {-code}" if code < 0 else f"exited with code {code}")
        return RankFailure(rank, "exit", "", f"{how} during the cell", "")

    def _output_caught_up(self) -> None:
        """Every line the ranks printed before they parked is shown before the park returns
        (the park is learnt on the event link, the lines come on the pipes: under load they
        trailed the return of `dbg.step()`)."""
        deadline = time.monotonic() + _MARKER_WAIT_S
        for relay in self._relays:
            relay.caught_up(max(0.0, deadline - time.monotonic()))

    def _wait_markers(self, cell_id: str) -> None:
        want = {(p.rank, name, cell_id) for p in self._ranks for name in ("stdout", "stderr")}
        with self._marker_cond:
            self._marker_cond.wait_for(lambda: want <= self._markers, _MARKER_WAIT_S)
            self._markers -= want

    def _marker(self, rank: int, name: str, cell_id: str) -> None:
        with self._marker_cond:
            self._markers.add((rank, name, cell_id))
            self._marker_cond.notify_all()

    def _pump(self, proc: RankProcess) -> None:
        while True:
            try:
                message = channel.recv(proc.results)
            except Exception:
                message = None
            self._messages.put((proc.rank, message))
            if message is None:
                return

    def stop(self) -> None:
        """End every rank and everything it started (SIGTERM, then SIGKILL); within 5 s."""
        if self._closed:
            return
        self._closed = True
        self._cell = None
        if self.debugger is not None:
            self.debugger.close()
        stop_ranks(self._ranks)
        for relay in self._relays:
            relay.join(1.0)
        close_fds(*(p.control for p in self._ranks), *(p.results for p in self._ranks))
        self._dir.remove()
        self._events.close()
        _live.discard(self)


@atexit.register
def _stop_all() -> None:
    for pool in list(_live):
        pool.stop()
