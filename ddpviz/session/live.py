"""Live sessions, the notebook side: `ddpviz.listen()` and the `Session` it returns.

A `Session` wraps a `Collector` (or, for `listen(follow=DIR)`, a FolderFeed) and keeps
everything it receives in a `Trace`; consumers subscribe (callbacks on the collector's thread)
or iterate from any thread. The ranks' side, `ddpviz.connect()`, is connect.py.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ddpviz.atomic import LinkError, SaveError, commit, creating, discard
from ddpviz.events import Event
from ddpviz.session.connect import ENV_CONNECT
from ddpviz.traces.fileformat import TraceWriter
from ddpviz.traces.trace import Trace
from ddpviz.transport.collector import (
    END_OF_STREAM,
    Collector,
    CollectorStats,
    iterate_queue,
)
from ddpviz.transport.subscribers import Subscribers

if TYPE_CHECKING:
    from ddpviz.debugger.client import Debugger
    from ddpviz.session.follow import FolderFeed
    from ddpviz.widgets.dashboard import Dashboard

__all__ = ["Session", "listen"]


class Session:
    """Every rank's events, live: subscribe, iterate, wait, save.

    Args:
        collector: where the events come from (`listen()` makes one; `listen(follow=DIR)`
            a FolderFeed reading a recording job's files).
        record: also append every event to a `.ddpviz` file as it arrives: to `RECORD.part`
            while the session runs (crash-safe: load it if the kernel died), renamed to
            `record` when the session closes, so an earlier file there survives until then.
            If writing fails (a full disk), events still reach every consumer; the failure is
            warned about once and kept in `record_error`, and the earlier file is unchanged.
    """

    def __init__(self, collector: Collector | FolderFeed, *,
                 record: str | os.PathLike[str] | None = None) -> None:
        self.collector = collector
        self._lock = threading.RLock()
        self._cv = threading.Condition(self._lock)
        self._trace = Trace(meta={"source": "session", "address": collector.address,
                                  "started_wall_ns": time.time_ns()})
        self.record = Path(record) if record else None
        self.record_error: SaveError | None = None  # why recording stopped, if it did
        self._writer: TraceWriter | None = None
        self._part = Path()
        if self.record is not None:
            part = self._part = self.record.with_name(self.record.name + ".part")
            try:
                with creating(part) as tmp:  # never through a link planted as RECORD.part
                    self._writer = TraceWriter(tmp, meta=self._trace.meta)
            except LinkError:
                collector.close()
                raise
            except OSError as exc:
                collector.close()
                raise SaveError(self.record, exc) from exc
        # removing takes the session's lock, which delivery holds: once unsubscribe() returns,
        # the callback is not called again
        self._subscribers = Subscribers(self._lock)
        self._queues: list[queue.SimpleQueue[Any]] = []
        self._closed = False
        self._connect_dir: Any = None  # a PrivateDir holding the connect file (listen())
        self._debugger: Debugger | None = None
        self._unsubscribe = collector.subscribe(self._receive, batch=True)

    # --- facts --------------------------------------------------------------------------------

    @property
    def connect_string(self) -> str:
        """The connect string to set as DDPVIZ_CONNECT for the ranks (keep it private).

        Its form is `tcp://HOST:PORT#SECRET`."""
        return self.collector.connect_string

    @property
    def connect_file(self) -> Path | None:
        """A file only you can read (0600, in a 0700 directory) holding the connect string, made
        by `listen()`; removed when the session closes. For a shell:
        `DDPVIZ_CONNECT="$(cat PATH)" torchrun ...`."""
        return None if self._connect_dir is None else self._connect_dir.file("connect")

    def publish_connect_file(self) -> Path:
        """Write the connect string into `connect_file` (once: later calls reuse the file).

        Returns:
            The file's path, in a fresh private directory (0700) removed by `close()`.
        """
        if self._connect_dir is None:
            from ddpviz.private_dir import PrivateDir

            self._connect_dir = PrivateDir()
            self._connect_dir.write_private("connect", self.connect_string + "\n")
        path = self.connect_file
        assert path is not None
        return path

    @property
    def env(self) -> dict[str, str]:
        """The environment a rank needs, e.g. for
        `subprocess.run(..., env={**os.environ, **s.env})`."""
        return {ENV_CONNECT: self.connect_string}

    @property
    def closed(self) -> bool:
        """Whether the session was closed (no event arrives any more)."""
        return self._closed

    @property
    def stats(self) -> CollectorStats:
        """A snapshot of what the collector has seen, per rank (events received, dropped and
        missing, messages rejected per reason, clock offsets, ranks finished)."""
        return self.collector.stats

    @property
    def trace(self) -> Trace:
        """The live trace (grows as events arrive), with the ranks' clock offsets."""
        for rank, (offset, error) in self.collector.stats.clock.items():
            self._trace.set_clock(rank, offset, error)
        return self._trace

    def __len__(self) -> int:
        return len(self._trace)

    # --- consumers ----------------------------------------------------------------------------

    def subscribe(self, callback: Callable[[Any], None], *, batch: bool = False,
                  replay: bool = False, history: Callable[[Trace], None] | None = None
                  ) -> Callable[[], None]:
        """Call `callback` for each new event, on the collector's thread.

        What came before the call is delivered in this thread, none missed or doubled: as a
        replay of events, or as the trace so far (`history`, which a dashboard uses to read its
        columns at once: no object per past event).

        Args:
            callback: called with each event, or with each received message's list of events
                when `batch` is true. An exception it raises is counted in `stats` and warned
                about once; delivery goes on.
            batch: pass lists of events (one per message) instead of single events.
            replay: first call `callback` with every event already received (in `events()`
                order; one list when `batch` is true). Ignored when `history` is given.
            history: instead of a replay, call `history(trace)` once with the session's live
                `trace` before any new event reaches `callback`.

        Returns:
            A function that unsubscribes `callback` (calling it again does nothing).
        """
        with self._lock:
            if history is not None:
                history(self.trace)
            elif replay:
                past = self._trace.events()
                if batch:
                    callback(past)
                else:
                    for e in past:
                        callback(e)
            return self._subscribers.add(callback, batch=batch)

    def events(self, *, replay: bool = True, timeout: float | None = None) -> Iterator[Event]:
        """Iterate over events from any thread: those already received, then new ones as they
        arrive.

        Args:
            replay: start with every event already received (default); False: only events
                that arrive after this call.
            timeout: end the iteration after this many seconds without a new event; None
                (default): wait until the session closes.

        Returns:
            An iterator of events, ending when the session closes or on `timeout`; it stops
            receiving once exhausted, closed, or garbage collected.
        """
        q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        with self._lock:
            if replay:
                q.put(self._trace.events())
            if self._closed:
                q.put(END_OF_STREAM)
            else:
                self._queues.append(q)

        def unsubscribe() -> None:
            with self._lock:
                if q in self._queues:
                    self._queues.remove(q)

        return iterate_queue(q, unsubscribe, timeout)

    def __iter__(self) -> Iterator[Event]:
        """Same as `events()`: blocks for new events until the session closes."""
        return self.events()

    def wait(self, *, events: int | None = None, ranks: int | None = None,
             timeout: float = 60.0) -> bool:
        """Block until enough has arrived: both conditions given must hold.

        Args:
            events: at least this many events received in all (None: no condition).
            ranks: at least this many ranks finished: their sender closed and everything it
                sent is in (None: no condition).
            timeout: the most seconds to wait.

        Returns:
            True when the conditions hold; False when `timeout` ran out, or the session was
            closed, before they did.
        """
        def done() -> bool:
            return ((events is None or len(self._trace) >= events)
                    and (ranks is None or len(self.collector.stats.closed) >= ranks))

        deadline = time.monotonic() + timeout
        with self._cv:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return done()
                self._cv.wait(min(left, 0.05))
        return True

    def _receive(self, batch: list[Event]) -> None:
        with self._lock:
            self._trace.extend(batch)
            if self._writer is not None:
                try:
                    self._writer.write_many(batch)
                    self._writer.flush()
                except OSError as exc:  # keep delivering: recording is a side line
                    self._record_failed(exc)
            for q in self._queues:
                q.put(batch)
            self._subscribers.deliver(batch, self.collector.report_callback_error)
            self._cv.notify_all()

    # --- the end ------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Save everything received so far, with the ranks' clock offsets, as a `.ddpviz` trace
        (atomically, like `Trace.save`); the session keeps receiving.

        Args:
            path: the file to write; an existing file is replaced.

        Returns:
            `path` as a `Path`.

        Raises:
            SaveError: the write failed; the previous file at `path` is unchanged.
        """
        return self.trace.save(path)

    def _record_failed(self, exc: OSError) -> None:
        """Stop recording (once): drop the partial file, keep the error, warn."""
        writer, self._writer = self._writer, None
        if writer is None:
            return
        with contextlib.suppress(OSError):
            writer.close()
        discard(self._part)
        assert self.record is not None
        self.record_error = SaveError(self.record, exc)
        with contextlib.suppress(Warning):  # on the collector's thread: must not raise
            warnings.warn(f"{self.record_error.message.splitlines()[0]} Recording stopped; "
                          "the session keeps receiving events (session.trace, subscribers). "
                          "Save them later with session.save(path).", UserWarning, stacklevel=2)

    def close(self) -> None:
        """Stop listening; iterators end; the record file (if any) gets the clock offsets and
        is renamed into place. Never raises for a recording failure (see `record_error`)."""
        if self._closed:
            return
        clock: dict[int, tuple[int, int]] = {}
        try:
            clock = dict(self.trace.clock)  # the final clock offsets
            self.collector.close()
            self._unsubscribe()
        finally:
            with self._lock:
                self._closed = True
                try:
                    self._finish_record(clock)
                finally:
                    for q in self._queues:
                        q.put(END_OF_STREAM)
                    self._queues.clear()
                    self._cv.notify_all()
                    if self._connect_dir is not None:
                        self._connect_dir.remove()

    def _finish_record(self, clock: dict[int, tuple[int, int]]) -> None:
        writer = self._writer
        if writer is None or self.record is None:
            return
        try:
            for rank, (offset, error) in sorted(clock.items()):
                writer.write_clock(rank, offset, error)
            writer.close()
            commit(self._part, self.record)
            self._writer = None
        except OSError as exc:
            self._record_failed(exc)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def dashboard(self, **kwargs: Any) -> Dashboard:
        """The live Dashboard of this session's events (see ddpviz.widgets.dashboard): it
        shows what arrived so far at once, then follows new events.

        Args:
            kwargs: passed to the Dashboard (`debugger`, `scheme`, `max_events`, `name`).

        Returns:
            The Dashboard widget (display it as a notebook cell's last value).
        """
        from ddpviz.widgets.dashboard import Dashboard

        return Dashboard(self, **kwargs)

    @property
    def debugger(self) -> Debugger:
        """The debugger of the ranks streaming into this session (a job started with
        `ddpviz record --debug --connect`): pause, inspect, resume (ddpviz/debugger/client.py).
        One per session; it sends commands only when called.

        Raises:
            DebuggerError: the session follows a recording's files (`listen(follow=DIR)`),
                which reaches no rank.
        """
        with self._lock:
            if self._debugger is None:
                from ddpviz.debugger.client import Debugger

                self._debugger = Debugger(self)
            return self._debugger

    def describe(self) -> str:
        """How to point ranks at this session (shown by `listen()`). Never shows the secret:
        cell output is saved with the notebook. Points at `connect_file` instead (writing it
        on first use, see `publish_connect_file`).

        Returns:
            A few lines of text, saying the address and who can reach it, where the connect
            string is, and the torchrun and subprocess commands that use it.
        """
        c = self.collector
        scope = ("this machine only; listen(host='0.0.0.0') for other nodes"
                 if c.host.startswith("127.") or c.host in ("::1", "localhost")
                 else f"interface {c.host}")
        path = self.publish_connect_file()
        return (f"ddpviz: listening on {c.address} ({scope}).\n"
                f"The connect string holds the session's secret, so it is not shown here: it is "
                f"in {path} (readable by you only) and in `session.connect_string`.\n"
                "In the training script call ddpviz.connect() before building the model, "
                "then launch it with:\n"
                f'  {ENV_CONNECT}="$(cat {path})" torchrun --nproc_per_node 2 train.py\n'
                "or from Python: subprocess.run([...], env={**os.environ, **session.env}).")

    def __repr__(self) -> str:
        s = self.collector.stats
        state = "closed" if self._closed else "live"
        return (f"<ddpviz Session {state} {self.collector.address}: {len(self._trace)} events "
                f"from ranks {sorted(s.received)} ({len(s.closed)} finished), "
                f"{s.total_rejected} rejected>")


def listen(host: str = "127.0.0.1", port: int = 0, *, secret: str | None = None,
           advertise: str | None = None, record: str | os.PathLike[str] | None = None,
           show: bool = True, max_pending: int | None = None,
           follow: str | os.PathLike[str] | None = None) -> Session:
    """Start a live session in this process (the notebook) and show how to connect to it.
    With `follow=DIR`: the live session of a job already running under `ddpviz record --out
    DIR`, read from its per-rank trace files (history, then new events; see
    ddpviz/session/follow.py).

    The connect string (address and secret) is not printed: cell outputs are saved with the
    notebook. It is in `session.connect_string`, `session.env`, and in `session.connect_file`
    (mode 0600), whose path is printed.

    Args:
        host: interface to bind; loopback by default ("0.0.0.0" for ranks on other nodes).
        port: TCP port (0: a free one).
        secret: session secret (default: a fresh random one).
        advertise: host name to put in the connect string when binding every interface.
        record: also stream every event into this `.ddpviz` file as it arrives.
        show: print where the connect string is and how to use it (never the secret).
        max_pending: connections allowed mid-handshake at once (default 12, see
            transport/handshake.py); ranks beyond it that connect in the same instant are
            disconnected and reconnect, counted under rejected "auth". For a fleet of N ranks
            starting together pass about N (each pending peer may hold ~4 MiB in the kernel).
        follow: a `ddpviz record --out` folder to attach to instead of listening (nothing is
            bound; the job is not touched; `session.close()` detaches). Only `record` and
            `show` apply with it.
    Returns:
        The Session; `session.connect_string` goes into the ranks' DDPVIZ_CONNECT.
    """
    if follow is not None:
        given = [name for name, value, default in (
            ("host", host, "127.0.0.1"), ("port", port, 0), ("secret", secret, None),
            ("advertise", advertise, None), ("max_pending", max_pending, None))
            if value != default]
        if given:
            raise ValueError(f"ddpviz: listen(follow=...) reads a folder and binds nothing, so "
                             f"{', '.join(given)} do not apply.\nPass follow= alone (with "
                             "record= or show= if wanted), or listen without follow=.")
        from ddpviz.session.follow import follow_folder

        return follow_folder(follow, record=record, show=show)
    collector = Collector(host, port, secret, advertise=advertise) if max_pending is None else \
        Collector(host, port, secret, advertise=advertise, max_pending=max_pending)
    session = Session(collector, record=record)
    if show:
        print(session.describe())
    return session
