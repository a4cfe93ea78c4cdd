"""Drive a launched job's debugger from the test process, without the notebook client: commands
go through `Collector.send_control`, replies are read from the session's event stream."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ddpviz
from ddpviz import events as ev
from ddpviz.debugger import protocol
from ddpviz.session.live import Session, listen
from tests.debugger import rank_fns

DEBUG_EVENTS = (ev.DebugArmed, ev.Parked, ev.Unparked, ev.Inspected, ev.Fetched, ev.CodeRan,
                ev.StacksTaken, ev.DebugRefused)


class Replies:
    """Every debugger event the collector accepted, in arrival order."""

    def __init__(self, session: Session) -> None:
        self.events: list[Any] = []
        self._cv = threading.Condition()
        session.collector.subscribe(self._add, batch=True)

    def _add(self, batch: list[Any]) -> None:
        mine = [e for e in batch if isinstance(e, DEBUG_EVENTS)]
        if mine:
            with self._cv:
                self.events += mine
                self._cv.notify_all()

    def wait(self, pick: Callable[[Any], bool], count: int, timeout: float = 60.0) -> list[Any]:
        """The first `count` events `pick` accepts (AssertionError after `timeout` s)."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while True:
                got = [e for e in self.events if pick(e)]
                if len(got) >= count:
                    return got[:count]
                left = deadline - time.monotonic()
                assert left > 0, f"only {got} of {count} after {timeout} s; all: {self.events}"
                self._cv.wait(min(left, 0.1))


class Job:
    """A launched debug job and its replies."""

    def __init__(self, session: Session, run: Any, out: Path, nprocs: int) -> None:
        self.session, self.run, self.out, self.nprocs = session, run, out, nprocs
        self.replies = Replies(session)

    def send(self, *commands: protocol.Command, rank: int | None = None) -> None:
        sent = self.session.collector.send_control(rank, list(commands))
        assert sent == ((rank,) if rank is not None else tuple(range(self.nprocs)))

    def ask(self, command: protocol.Command, cls: type, count: int | None = None,
            timeout: float = 60.0) -> dict[int, Any]:
        """Send `command` to every rank; {rank: its reply of type `cls`}."""
        self.send(command)
        n = self.nprocs if count is None else count
        got = self.replies.wait(lambda e: isinstance(e, cls) and getattr(e, "request", -1)
                                == command.request, n, timeout)
        return {e.rank: e for e in got}

    def parked(self, count: int, timeout: float = 60.0) -> list[Any]:
        """The first `count` Parked events of every rank (per rank in order), once all are in."""
        got = self.replies.wait(lambda e: isinstance(e, ev.Parked), count * self.nprocs,
                                timeout)
        return got

    def record(self, rank: int) -> dict[str, Any]:
        out: dict[str, Any] = json.loads((self.out / f"rank{rank}.json").read_text())
        return out


def request() -> int:
    return protocol.next_request()


@contextmanager
def debug_job(kind: str, steps: int, tmp: Path, *, nprocs: int = 2, nan_at: int = -1,
              sleep: float = 0.0, commands: tuple[protocol.Command, ...] = (),
              debug: bool = True, optim: str = "sgd") -> Iterator[Job]:
    """Launch `rank_fns.train` with debug=True; the ranks start training only once every rank
    is connected and has received `commands` (so a break on step 3 is set in time)."""
    tmp.mkdir(parents=True, exist_ok=True)
    go = tmp / "go"
    with listen(show=False) as session:
        run = ddpviz.launch(rank_fns.train, nprocs, args=(kind, steps, str(tmp)),
                            kwargs={"nan_at": nan_at, "go": str(go), "sleep": sleep,
                                    "optim": optim},
                            session=session, debug=debug, timeout=240)
        job = Job(session, run, tmp, nprocs)
        try:
            assert session.collector.wait(lambda s: len(s.peers) == nprocs, timeout=120), \
                "the ranks never connected"
            if commands:
                job.send(*commands)
            # the ranks wait for the commands to arrive before they train (rank_fns.train)
            ready = tmp / "go.tmp"  # (renamed: a rank never reads it half written)
            ready.write_text("commands" if commands else "")
            ready.replace(go)
            yield job
        finally:
            if not run.done():
                run.stop()


# the unpaused runs so far in this process: (kind, steps, nprocs, nan_at, optim, device) ->
# records. The training is seeded, so a run with the same arguments is the same run: tests
# share it.
_REFERENCES: dict[tuple[str, int, int, int, str, str], list[dict[str, Any]]] = {}


def reference(kind: str, steps: int, tmp: Path, *, nprocs: int = 2,
              nan_at: int = -1, optim: str = "sgd",
              device: str = "cpu") -> list[dict[str, Any]]:
    """The unpaused run's records per rank (launched without the debugger; once per process
    for the same arguments)."""
    key = (kind, steps, nprocs, nan_at, optim, device)
    if key not in _REFERENCES:
        _REFERENCES[key] = _reference(kind, steps, tmp, nprocs=nprocs, nan_at=nan_at,
                                      optim=optim, device=device)
    return _REFERENCES[key]


def _reference(kind: str, steps: int, tmp: Path, *, nprocs: int, nan_at: int,
               optim: str, device: str) -> list[dict[str, Any]]:
    tmp.mkdir(parents=True, exist_ok=True)
    run = ddpviz.launch(rank_fns.train, nprocs, args=(kind, steps, str(tmp)),
                        kwargs={"nan_at": nan_at, "optim": optim, "device": device},
                        timeout=240)
    run.wait(timeout=240)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(nprocs)]


def launch_debug(kind: str, steps: int, tmp: Path, *, nprocs: int = 2, nan_at: int = -1,
                 sleep: float = 0.0, optim: str = "sgd",
                 device: str = "cpu") -> tuple[ddpviz.Run, Path]:
    """`rank_fns.train` launched with debug=True for the public `run.debugger`; the ranks wait
    for `go` (`go_ahead`) to train, so that breaks set first are in place."""
    tmp.mkdir(parents=True, exist_ok=True)
    go = tmp / "go"
    run = ddpviz.launch(rank_fns.train, nprocs, args=(kind, steps, str(tmp)),
                        kwargs={"go": str(go), "sleep": sleep, "nan_at": nan_at,
                                "optim": optim, "device": device}, debug=True, timeout=300)
    assert run.session.collector.wait(lambda s: len(s.peers) == nprocs, timeout=120), \
        "the ranks never connected"
    return run, go


@contextmanager
def stopping(run: ddpviz.Run) -> Iterator[ddpviz.Run]:
    """The block with `run`; its ranks stopped after it when they have not ended (a failed
    assertion never leaves ranks behind)."""
    try:
        yield run
    finally:
        if not run.done():
            run.stop()


def go_ahead(go: Path) -> None:
    """Let the ranks of `launch_debug` train once each has every command sent so far."""
    last = protocol.last_request()  # (next_request() - 1 is not it: numbers follow the clock)
    ready = go.with_name("go.tmp")  # (renamed: a rank never reads it half written)
    ready.write_text(f"commands {last}")
    ready.replace(go)


def buckets(run: ddpviz.Run, step: int, rank: int = 0) -> int:
    """How many buckets rank `rank`'s DDP all-reduces at `step` (its bucket map then)."""
    maps = [e for e in run.trace.events() if isinstance(e, ev.BucketAssigned)
            and e.rank == rank and e.step <= step]
    assert maps, "no bucket map was reported"
    return len(maps[-1].buckets)
