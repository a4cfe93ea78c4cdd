"""The rank side of the event stream: a `Sender` takes events without ever blocking training.

`sender(event)` appends to a bounded in-process buffer (a deque; append and popleft are atomic
under the GIL) and returns. A background thread drains it in batches and ships them: to the
notebook's collector over zmq (`Sender(connect, rank)`), or into a local trace file
(`Sender.to_file(path, rank)`). When the buffer is full the event is dropped and counted; the
next event that fits is preceded by an `EventsDropped(count)` marker, and the thread warns.
See [Note: clock alignment] for the hello/ping exchange that aligns this rank's clock.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import os
import socket
import sys
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, Protocol

import zmq
from zmq.utils.monitor import parse_monitor_message

from ddpviz.atomic import creating
from ddpviz.debugger.protocol import Command
from ddpviz.events import Event, EventsDropped
from ddpviz.traces.fileformat import End, TraceWriter
from ddpviz.transport.codec import (
    MAX_MESSAGE_BYTES,
    Codec,
    WireError,
    boot_id,
    make_header,
    parse_connect_string,
)
from ddpviz.transport.handshake import secure_client, watch_link

_REFUSALS = 3  # failed handshakes in a row (none ever succeeded) that mean "refused"
_HELLO_RETRY_S = 1.0  # a hello not answered by then is sent again (its connection may be gone)
_CLIENT_WATCHED = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
                   | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                   | zmq.EVENT_HANDSHAKE_FAILED_AUTH)

_MIN_IDLE_S = 0.001  # the shipping thread polls the buffer, backing off to _MAX_IDLE_S
_MAX_IDLE_S = 0.02
_PINGS = 5  # clock samples per connection; the one with the shortest round trip wins
_PING_RETRY_S = 1.0
_WARN_EVERY_S = 5.0
_EARLY_CONTROL = 16  # control messages kept for a callback not set yet (a debugger installed
# just after the rank connected); more are dropped
_WINDOW_FRAMES = 32  # batches shipped but not yet confirmed, at most (See [Note: confirmed
_WINDOW_BYTES = 16 << 20  # batches]); and their encoded size

# [Note: clock alignment]
# Events carry time.monotonic_ns() of their rank. On one host every process shares that clock;
# across nodes the clocks are unrelated. At connect, the sender pings the collector like NTP:
# it sends t1 (its clock), the collector stamps t2 (its clock) on arrival and answers, the
# sender reads t4 on receipt. Then offset = t2 - (t1 + t4) / 2 maps the rank's clock onto the
# collector's, and because t2 happened somewhere between t1 and t4, the error is at most
# (t4 - t1) / 2, half the round trip (tens of microseconds on loopback, about half a network
# RTT across nodes; asymmetric routes make the real error approach that bound). Of _PINGS
# samples the shortest round trip is kept and sent as a "clock" message. Until a pong arrives,
# the collector falls back to comparing wall clocks from the hello (error: NTP's, ~ms).
# Processes under one kernel (same Linux boot id, sent in the hello) share CLOCK_MONOTONIC:
# their offset is exactly 0 and pings cannot improve on it.

# [Note: confirmed batches]
# zmq delivers a message only while its connection lives: a message queued on a connection that
# is then shut (the collector's pending-handshake guard shedding a flood, a network blip) is
# gone, and the DEALER reconnects without a word. So the collector confirms every batch of
# events ("ack" with the batch's number, cumulative), and the sender keeps each batch until it
# is confirmed (at most _WINDOW_FRAMES / _WINDOW_BYTES of them; beyond that the shipping thread
# waits, and events wait in, or overflow counted from, the in-process buffer). When its
# connection is replaced, the sender greets the new one and resends every unconfirmed batch, in
# order, under its original batch number (at once, even with nothing new to send: a job that
# hangs sends nothing more, and its last events are the ones wanted); the collector delivers a
# batch number once and confirms duplicates again (See [Note: one stream per sender] in
# collector.py). A connection that went silent is dropped by heartbeats and replaced like any
# other (See [Note: a silent link] in handshake.py). At close the sender waits (up to the close
# deadline, whatever the link does) until every batch and then its "bye" are confirmed; batches
# still unconfirmed then count as dropped (some may still arrive, if the link comes back after
# the close: a drop the sender cannot rule out, counted rather than lost silently).


def _events(items: list[Event]) -> int:
    """How many of `items` are events, not drop markers (markers are not events)."""
    return sum(1 for e in items if type(e) is not EventsDropped)


class SenderStats(NamedTuple):
    sent: int  # events shipped, including EventsDropped markers
    markers: int  # EventsDropped markers among them
    dropped: int  # events dropped because the buffer was full (or undeliverable at close)
    frames: int  # messages (or trace chunks) written


class _Sink(Protocol):
    def open(self, deadline: Callable[[], float | None]) -> None: ...
    def ship(self, events: list[Event]) -> bool: ...
    def service(self) -> None: ...
    def close(self, sent: int, dropped: int, deadline: float) -> tuple[int, int]: ...
    def describe(self) -> str: ...
    unreachable: str  # how the drop warning says the sink failed
    fix: str  # what to check when the sink stopped
    control: Callable[[tuple[Command, ...]], None] | None  # see Sender.on_control


class Sender:
    """Emitter that ships a rank's events from a background thread; never blocks the caller.

    Args:
        connect: the connect string `tcp://HOST:PORT#SECRET` shown by `ddpviz.listen()`.
        rank: this process's rank (stamped on control messages; events carry their own).
        capacity: events the buffer holds; beyond it events are dropped and counted.
        batch: most events per message.
        clock: the monotonic clock events are stamped with (a test can skew it).
    """

    def __init__(self, connect: str, rank: int, *, capacity: int = 1 << 16, batch: int = 1024,
                 clock: Callable[[], int] = time.monotonic_ns) -> None:
        address, secret = parse_connect_string(connect)
        self._init(_ZmqSink(address, secret, rank, clock), rank, capacity, batch)

    @classmethod
    def to_file(cls, path: str | os.PathLike[str], rank: int, *, capacity: int = 1 << 16,
                batch: int = 4096) -> Sender:
        """A Sender that records into a `.ddpviz` trace file instead of a socket (crash-safe:
        every batch reaches the OS before the next is taken)."""
        self = cls.__new__(cls)
        self._init(_FileSink(Path(path), rank), rank, capacity, batch)
        return self

    def _init(self, sink: _Sink, rank: int, capacity: int, batch: int) -> None:
        if capacity < 1 or batch < 1:
            raise ValueError(f"ddpviz: Sender needs capacity >= 1 and batch >= 1, got "
                             f"capacity={capacity}, batch={batch}.")
        self.rank = rank
        self._sink = sink
        self._capacity = capacity
        self._nominal_capacity = capacity
        self._batch = batch
        self._buf: collections.deque[Event] = collections.deque()
        self._lock = threading.Lock()
        self._dropped = 0  # drops since the last marker
        self._first_drop: Event | None = None
        self._dropped_total = 0
        self._unwarned = 0
        self._last_warn = 0.0
        self._sent = 0
        self._markers = 0
        self._frames = 0
        self._wake = threading.Event()
        self._cv = threading.Condition()
        self._flush_req = 0  # flush() calls so far; the thread answers with _flush_done
        self._flush_done = 0
        self._closing = threading.Event()
        self._deadline: float | None = None
        self._closed = False
        self._inflight: list[Event] = []  # the batch being shipped
        self.error: BaseException | None = None  # why the shipping thread stopped, if it did
        self._thread = threading.Thread(target=self._run, name=f"ddpviz-sender-{rank}",
                                        daemon=True)
        self._thread.start()
        _open_senders.add(self)

    # --- the caller's side (hot path) ---------------------------------------------------------

    def __call__(self, event: Event, /) -> None:
        buf = self._buf
        if len(buf) < self._capacity:
            if self._dropped:
                self._mark()
            buf.append(event)
        else:
            self._drop(event)

    def _drop(self, event: Event) -> None:
        with self._lock:
            if self._dropped == 0:
                self._first_drop = event
            self._dropped += 1
            self._dropped_total += 1

    def _mark(self) -> None:
        with self._lock:
            first, n = self._first_drop, self._dropped
            if not n or first is None:
                return
            # The marker takes the first dropped event's seq: that number was never delivered,
            # so it cannot collide, and it says where the hole begins.
            self._buf.append(EventsDropped(first.rank, first.step, first.t_ns, first.seq, n))
            self._dropped, self._first_drop = 0, None
            self._unwarned += n

    # --- control ------------------------------------------------------------------------------

    def on_control(self, callback: Callable[[tuple[Command, ...]], None] | None) -> None:
        """Hand the debugger's commands (signed "control" messages from the collector this
        Sender connected to, never replayed) to `callback(commands)`, called on the shipping
        thread: it must only queue them, never block (None: ignore control messages, the
        default). A callback that raises is dropped, said once; the events go on. Commands
        that came before a callback was set are kept (a few) and handed to the first one: the
        notebook may send them as soon as this rank connects, before its debugger is
        installed."""
        self._sink.control = callback
        self._wake.set()  # hand on the commands kept so far without waiting for an event

    @property
    def stats(self) -> SenderStats:
        return SenderStats(self._sent, self._markers, self._dropped_total, self._frames)

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every event emitted so far has been shipped. Returns False on timeout."""
        with self._cv:
            self._flush_req += 1
            target = self._flush_req
            self._wake.set()
            return self._cv.wait_for(
                lambda: self._flush_done >= target or not self._thread.is_alive(), timeout
            ) and self._flush_done >= target

    def close(self, timeout: float = 10.0) -> None:
        """Ship what is buffered (up to `timeout` seconds), say goodbye, stop the thread.

        Events still undelivered at the deadline are counted as dropped and warned about.
        Emitting after close discards the event (counted)."""
        if self._closed:
            return
        self._closed = True
        self._deadline = time.monotonic() + timeout
        self._closing.set()
        self._wake.set()
        self._thread.join(timeout + 5.0)
        self._capacity = 0  # later emits are counted as drops
        if self.error is not None and not self._thread.is_alive():
            # an emit that saw the old capacity just before the thread failed appended after
            # the thread emptied the buffer: that event went nowhere either
            left = [self._buf.popleft() for _ in range(len(self._buf))]
            with self._lock:
                self._dropped_total += _events(left)
        _open_senders.discard(self)
        self._warn_drops(force=True)

    def __enter__(self) -> Sender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self.stats
        return (f"<ddpviz Sender rank={self.rank} to {self._sink.describe()}: sent={s.sent} "
                f"dropped={s.dropped}{' closed' if self._closed else ''}>")

    # --- the shipping thread ------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._sink.open(lambda: self._deadline)
            self._loop()
        except BaseException as e:  # keep training alive; report through .error and a warning
            self.error = e
            self._capacity = 0
            # What the sink failed on and what the buffer held never went anywhere: dropped.
            lost = self._inflight + [self._buf.popleft() for _ in range(len(self._buf))]
            self._inflight = []
            n = _events(lost)
            with self._lock:
                # (pending drops are in _dropped_total already; they get no marker now)
                self._dropped_total += n
                self._dropped, self._first_drop = 0, None
            _warn(f"ddpviz: rank {self.rank}'s event sender to {self._sink.describe()} stopped: "
                  f"{type(e).__name__}: {e}\n{n} buffered events and all later ones are "
                  f"dropped (counted in stats.dropped); {self._sink.fix}.")
            with self._cv:
                self._cv.notify_all()

    def _loop(self) -> None:
        buf, idle_s = self._buf, _MIN_IDLE_S
        while True:
            req = self._flush_req  # read before looking at the buffer: see flush()
            n = len(buf)
            if n:
                take = min(n, self._batch)
                batch = self._inflight = [buf.popleft() for _ in range(take)]
                self._ship(batch)
                self._inflight = []
                self._warn_drops()
                idle_s = _MIN_IDLE_S
                continue
            if self._dropped and (self._closing.is_set() or req > self._flush_done):
                self._mark()  # flush/close: report drops even if no later event arrives
                continue
            if req > self._flush_done:
                with self._cv:
                    self._flush_done = req
                    self._cv.notify_all()
            if self._closing.is_set():
                break
            self._sink.service()
            if self._wake.wait(idle_s):
                self._wake.clear()
                idle_s = _MIN_IDLE_S
            else:
                idle_s = min(idle_s * 2, _MAX_IDLE_S)
        lost, markers = self._sink.close(self._sent, self._dropped_total,
                                         self._deadline or time.monotonic())
        if lost or markers:  # shipped, never confirmed before the deadline: not delivered
            with self._lock:
                self._sent -= lost + markers
                self._markers -= markers
                self._dropped_total += lost
                self._unwarned += lost

    def _ship(self, batch: list[Event]) -> None:
        if not self._sink.ship(batch):  # undeliverable before the close deadline
            rest = [self._buf.popleft() for _ in range(len(self._buf))]
            # the rest cannot go either: do not wait for each batch. Markers are not events.
            lost = _events(batch + rest)
            with self._lock:
                self._dropped_total += lost
                self._unwarned += lost
            return
        self._frames += 1
        self._sent += len(batch)
        self._markers += sum(1 for e in batch if type(e) is EventsDropped)

    def _warn_drops(self, force: bool = False) -> None:
        with self._lock:  # called from the shipping thread and from close()
            n = self._unwarned
            if not n or not (force or time.monotonic() - self._last_warn > _WARN_EVERY_S):
                return
            self._unwarned, self._last_warn = 0, time.monotonic()
        _warn(f"ddpviz: rank {self.rank} dropped {n} events ({self._dropped_total} in total): "
              f"the sender's buffer (capacity {self._nominal_capacity}) was full or "
              f"{self._sink.describe()} {self._sink.unreachable}.\nThe stream shows EventsDropped "
              "markers where events are missing; pass a larger capacity= or emit fewer events.")


_open_senders: weakref.WeakSet[Sender] = weakref.WeakSet()


@atexit.register
def _close_open_senders() -> None:
    """At interpreter exit, ship what open Senders still hold (their threads are daemons)."""
    for sender in list(_open_senders):
        sender.close(timeout=5.0)


def _forget_in_child() -> None:
    """A forked child has no shipping thread: its inherited Senders drop (and count)."""
    for sender in list(_open_senders):
        sender._capacity = 0
        sender._closed = True
    _open_senders.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def _warn(message: str) -> None:
    # Called from the shipping thread: a warnings-as-errors filter must not kill it.
    with contextlib.suppress(Warning):
        warnings.warn(message, UserWarning, stacklevel=2)


class _ZmqSink:
    """Ships batches over a zmq DEALER socket and runs the clock exchange."""

    unreachable = "was unreachable"
    fix = "check the connect string and that the notebook still listens"

    def __init__(self, address: str, secret: bytes, rank: int,
                 clock: Callable[[], int]) -> None:
        self.address, self.rank, self._clock = address, rank, clock
        self._codec = Codec(secret)
        self._secret = secret
        self._id = uuid.uuid4().hex  # signed into every header: replays are told apart by it
        self._seq = 0
        self._samples = 0
        self._best_error: int | None = None
        self._last_ping = 0.0
        self._deadline: Callable[[], float | None] = lambda: None
        self._ctx: zmq.Context[zmq.Socket[bytes]] | None = None
        self._sock: zmq.Socket[bytes] | None = None
        self._monitor: zmq.Socket[bytes] | None = None
        # The collector answered a hello on the current connection (See [Note: which
        # connection is pending] in handshake.py): only then do events go.
        self._answered = False
        self._hello_at: float | None = None  # when the last unanswered hello went
        self._refusals = 0  # handshakes failed in a row; -1 once one succeeded
        self.disconnects = 0  # connections lost so far (cut, refused, or dropped as silent)
        self._epoch_ns = 0  # our clock at the last disconnect: older pongs prove nothing
        # See [Note: confirmed batches]: (batch number, encoded body, events, markers) of the
        # batches not yet confirmed, oldest first; the first _on_conn of them went on the
        # current connection.
        self._unconfirmed: collections.deque[tuple[int, bytes, int, int]] = collections.deque()
        self._unconfirmed_bytes = 0
        self._on_conn = 0
        self._next_batch = 0
        self._bye_confirmed = False
        self.control: Callable[[tuple[Command, ...]], None] | None = None
        self._control_seq: dict[str, int] = {}  # per collector id: the next fresh frame number
        self._early: list[tuple[Command, ...]] = []  # control messages before a callback

    def describe(self) -> str:
        return self.address

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq - 1

    def open(self, deadline: Callable[[], float | None]) -> None:
        self._deadline = deadline
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.SNDHWM, 256)
        sock.setsockopt(zmq.SNDTIMEO, 100)
        sock.setsockopt(zmq.LINGER, 0)
        # Queue only on a live connection: while the collector is away, events wait in (and
        # overflow from) our counted buffer, never in an invisible zmq queue.
        sock.setsockopt(zmq.IMMEDIATE, 1)
        secure_client(sock, self._secret)
        watch_link(sock, client=True)  # a silent link is noticed, dropped, and connected again
        if ":[" in self.address or self.address.count(":") > 2:
            sock.setsockopt(zmq.IPV6, 1)
        self._monitor = sock.get_monitor_socket(_CLIENT_WATCHED)
        sock.connect(self.address)
        self._sock = sock
        self._hello()

    def _hello(self) -> None:
        header = make_header("hello", self.rank, self._id, self._next_seq(), t_ns=self._clock(),
                             wall_ns=time.time_ns(), host=socket.gethostname(), pid=os.getpid(),
                             boot=boot_id() if self._clock is time.monotonic_ns else "")
        self._hello_at = time.monotonic()
        self._send(self._codec.encode(header), _HELLO_RETRY_S)
        self._last_ping = time.monotonic()

    def _watch(self) -> None:
        """Read the socket's monitor: a new connection must be greeted again before events go
        on it; a failed handshake means the collector refused our key (said once)."""
        mon = self._monitor
        assert mon is not None
        while True:
            try:
                msg = mon.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            kind = parse_monitor_message(msg)["event"]
            if kind == zmq.EVENT_DISCONNECTED:
                self.disconnects += 1
                # A pong still queued from the old connection must not count for the next.
                self._answered, self._hello_at = False, None
                self._epoch_ns = self._clock()
                self._on_conn = 0  # what went on it and is unconfirmed goes again
            elif kind == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._refusals = -1  # our key works here
                if not self._answered and self._hello_at is None:
                    self._hello_at = 0.0  # greet at once
            elif self._refusals >= 0:
                # A server that cannot decrypt our hello just hangs up, which the client sees
                # as a handshake failure without detail (as when a full collector sheds a
                # connection mid-handshake): say so after a few in a row, never having got in.
                self._refusals += 1
                if self._refusals == _REFUSALS:
                    _warn(f"ddpviz: rank {self.rank}: the notebook refused this rank's key "
                          f"({_REFUSALS} secure handshakes with {self.address} failed): the "
                          "secret after '#' in the connect string is not this session's, or "
                          "something other than a ddpviz collector listens there (or a flood "
                          "of connections to it crowds this rank out).\nEvents wait "
                          "in the buffer and are dropped (counted) while refused; copy the "
                          "connect string again from the notebook (ddpviz.listen()).")

    def _ready(self) -> bool:
        """Wait until the collector has answered a hello on this connection (greeting again
        every _HELLO_RETRY_S); False once past the close deadline."""
        while True:
            self._service()
            if self._answered:
                return True
            if self._past_deadline():
                return False
            if self._hello_at is None or time.monotonic() - self._hello_at > _HELLO_RETRY_S:
                self._hello()
            assert self._sock is not None
            self._sock.poll(20, zmq.POLLIN)

    def _past_deadline(self) -> bool:
        deadline = self._deadline()
        return deadline is not None and time.monotonic() > deadline

    def _send(self, parts: list[bytes], limit_s: float | None = None,
              answered: bool = False) -> bool | None:
        """Blocking send, retried while the collector is slow or away; False once past the
        close deadline (or `limit_s` seconds). With answered=True, None when the connection
        the collector answered on has gone meanwhile (greet the next one first)."""
        assert self._sock is not None
        give_up = None if limit_s is None else time.monotonic() + limit_s
        while True:
            try:
                self._sock.send_multipart(parts, copy=False)
                return True
            except zmq.Again:
                if answered:
                    self._watch()
                    if not self._answered:
                        return None
                deadline = self._deadline()
                if deadline is not None and give_up is not None:
                    deadline = min(deadline, give_up)
                elif deadline is None:
                    deadline = give_up
                if deadline is not None and time.monotonic() > deadline:
                    return False

    def ship(self, events: list[Event]) -> bool:
        body = self._codec.encode_body(events)
        if len(body) + 1024 > MAX_MESSAGE_BYTES:
            if len(events) > 1:
                half = len(events) // 2
                return self.ship(events[:half]) and self.ship(events[half:])
            # The collector would drop the connection: never send it; say so (its seq is the
            # gap the collector counts).
            _warn(f"ddpviz: rank {self.rank} did not send a {type(events[0]).__name__} event "
                  f"of {len(body)} bytes: messages are limited to {MAX_MESSAGE_BYTES} bytes.\n"
                  "Please report this as a ddpviz bug (events are meant to be small).")
            return True
        markers = sum(1 for e in events if type(e) is EventsDropped)
        self._unconfirmed.append((self._next_batch, body, len(events), markers))
        self._unconfirmed_bytes += len(body)
        self._next_batch += 1
        if self._pump(lambda: len(self._unconfirmed) < _WINDOW_FRAMES
                      and self._unconfirmed_bytes < _WINDOW_BYTES):
            return True
        if self._unconfirmed and self._unconfirmed[-1][0] == self._next_batch - 1:
            # Past the close deadline: the caller counts this batch as dropped; forget it.
            self._forget(self._unconfirmed.pop())
            self._on_conn = min(self._on_conn, len(self._unconfirmed))
        return False

    def _forget(self, item: tuple[int, bytes, int, int]) -> None:
        self._unconfirmed_bytes -= len(item[1])

    def _pump(self, done: Callable[[], bool]) -> bool:
        """Send the unconfirmed batches not yet sent on this connection and read confirmations
        until `done()`; False once past the close deadline."""
        while True:
            if not self._ready():
                return False
            while self._on_conn < len(self._unconfirmed):
                batch, body, count, _ = self._unconfirmed[self._on_conn]
                # Numbered after the hellos _ready sent: the collector refuses a frame number
                # lower than one it has seen (as a replay).
                header = make_header("events", self.rank, self._id, self._next_seq(),
                                     count=count, batch=batch)
                ok = self._send(self._codec.encode_with_body(header, body), answered=True)
                if ok is None:
                    break  # the connection went: greet the next one, resend from the first
                if not ok:
                    return False
                self._on_conn += 1
            self._service()
            if self._answered and done():
                return True
            if self._past_deadline():
                # Answered, all sent, never confirmed: a silent link looks like this until the
                # heartbeats drop it (See [Note: a silent link] in handshake.py).
                return False
            if self._answered and self._on_conn >= len(self._unconfirmed):
                assert self._sock is not None
                self._sock.poll(20, zmq.POLLIN)

    def _confirmed(self, batch: int) -> None:
        """The collector has every batch up to `batch`."""
        q = self._unconfirmed
        while q and q[0][0] <= batch:
            self._forget(q.popleft())
            self._on_conn = max(0, self._on_conn - 1)
        if batch >= self._next_batch:
            self._bye_confirmed = True  # the bye carries the batch number after the last

    def service(self) -> None:
        """While idle: read the socket; on a new connection, greet and resend what is
        unconfirmed (See [Note: confirmed batches]): the batches cut off with the old one would
        otherwise wait for the next batch, and a job that hangs sends none."""
        self._service()
        if not self._unconfirmed:
            return
        if not self._answered:
            if self._hello_at is None or time.monotonic() - self._hello_at > _HELLO_RETRY_S:
                self._hello()
        elif self._on_conn < len(self._unconfirmed):
            self._pump(lambda: True)

    def _service(self) -> None:
        """Read pongs and acks; ping again until _PINGS samples are in (See [Note: clock
        alignment])."""
        sock = self._sock
        assert sock is not None
        self._watch()
        if self._early and self.control is not None:
            early, self._early = self._early, []
            for commands in early:
                self._hand_on(commands)
        while sock.poll(0, zmq.POLLIN):
            parts = sock.recv_multipart()
            t4 = self._clock()
            try:
                frame = self._codec.decode(parts)
            except WireError:
                continue  # not our collector; nothing to align with
            h = frame.header
            if h.kind == "ack":
                self._confirmed(h.batch)
                continue
            if h.kind == "control":
                self._control(h.sender, h.seq, h.rank, frame.commands)
                continue
            if h.kind != "pong":
                continue
            if h.t_ns >= self._epoch_ns:
                self._answered, self._hello_at = True, None
            self._samples += 1
            error = (t4 - h.t_ns + 1) // 2
            if self._best_error is None or error < self._best_error:
                self._best_error = error
                offset = h.peer_ns - (h.t_ns + t4) // 2
                clock = make_header("clock", self.rank, self._id, self._next_seq(),
                                    offset_ns=offset, error_ns=error)
                self._send(self._codec.encode(clock), 1.0)
            self._last_ping = 0.0  # answered: the next ping may go now
        if self._samples < _PINGS and time.monotonic() - self._last_ping > _PING_RETRY_S:
            ping = make_header("ping", self.rank, self._id, self._next_seq(), t_ns=self._clock())
            self._last_ping = time.monotonic()
            self._send(self._codec.encode(ping), 1.0)

    def _control(self, collector: str, seq: int, rank: int,
                 commands: tuple[Command, ...]) -> None:
        """A signed control message: handed on once (a frame number not above the last one
        from that collector is a replay, ignored), only if it is meant for this rank; kept
        (up to _EARLY_CONTROL messages) while no callback is set yet."""
        if rank != self.rank or seq < self._control_seq.get(collector, 0):
            return
        if len(self._control_seq) >= 64:
            self._control_seq.clear()  # a new collector per notebook restart: few ever
        self._control_seq[collector] = seq + 1
        if self.control is None:
            if len(self._early) < _EARLY_CONTROL:
                self._early.append(commands)
            return
        self._hand_on(commands)

    def _hand_on(self, commands: tuple[Command, ...]) -> None:
        callback = self.control
        if callback is None:
            return
        try:
            callback(commands)
        except Exception as exc:  # the events must go on: drop the debugger, say so once
            self.control = None
            _warn(f"ddpviz: rank {self.rank}: the debugger's control callback failed "
                  f"({exc!r}); ddpviz stops it (no pausing from the notebook), the job goes on.")

    def close(self, sent: int, dropped: int, deadline: float) -> tuple[int, int]:
        """Returns the events and markers shipped but never confirmed (dropped after all)."""
        if self._sock is None or self._ctx is None:
            return 0, 0
        self._pump(lambda: not self._unconfirmed)
        lost = sum(item[2] - item[3] for item in self._unconfirmed)  # markers are not events
        lost_markers = sum(item[3] for item in self._unconfirmed)

        def bye() -> list[bytes]:
            # Numbered when sent: a ping or clock message that _ready sent in between must not
            # carry a later number (the collector refuses a lower one as a replay).
            return self._codec.encode(make_header(
                "bye", self.rank, self._id, self._next_seq(), count=sent - lost - lost_markers,
                dropped=dropped + lost, batch=self._next_batch))

        if time.monotonic() > deadline:
            self._send(bye(), 0.0)  # one try: the counts say what was lost
        # Greeted again and said again on every new connection, until confirmed or the deadline.
        while not self._bye_confirmed and time.monotonic() <= deadline and self._ready():
            if not self._send(bye(), max(0.0, deadline - time.monotonic()), answered=True):
                continue
            until = min(deadline, time.monotonic() + _HELLO_RETRY_S)
            while not self._bye_confirmed and self._answered and time.monotonic() < until:
                self._sock.poll(20, zmq.POLLIN)
                self._service()
        linger_ms = max(0, int((deadline - time.monotonic()) * 1000)) if not \
            self._bye_confirmed else 0
        self._sock.close(linger=linger_ms)
        if self._monitor is not None:
            self._monitor.close(linger=0)
        self._ctx.term()
        self._sock = self._ctx = None
        return lost, lost_markers


class _FileSink:
    """Appends batches to a trace file; each batch reaches the OS before the next is taken."""

    unreachable = "could not be written"
    fix = ("the file keeps every event written before; free space there (or check the folder "
           "and its permissions) and run again")

    def __init__(self, path: Path, rank: int) -> None:
        self.path, self.rank = path, rank
        self._writer: TraceWriter | None = None
        self.control: Callable[[tuple[Command, ...]], None] | None = None  # never called

    def describe(self) -> str:
        return str(self.path)

    def open(self, deadline: Callable[[], float | None]) -> None:
        # Enough to align this file's clock with another host's (Trace.merge).
        meta = {"rank": self.rank, "host": socket.gethostname(), "pid": os.getpid(),
                "boot": boot_id(), "mono_ns": time.monotonic_ns(), "wall_ns": time.time_ns()}
        # Created new, never through a link planted under its name (a shared work folder).
        with creating(self.path) as tmp:
            self._writer = TraceWriter(tmp, meta=meta)

    def ship(self, events: list[Event]) -> bool:
        assert self._writer is not None
        self._writer.write_many(events)
        self._writer.flush()
        return True

    def service(self) -> None:
        pass

    def close(self, sent: int, dropped: int, deadline: float) -> tuple[int, int]:
        if self._writer is not None:
            # A clean close says so in the file, for readers that cannot see this process
            # (follow.py on another node, `ddpviz diagnose DIR`): See [Note: a rank's end in
            # its file] (tracefile.py).
            writer, self._writer = self._writer, None
            try:
                writer.write_end(End(self.rank, sent, dropped, _exit_error()))
            except OSError:
                # No room even for it (every event was written before): the file reads as
                # unfinished, nothing else is lost; its buffer cannot be written either.
                with contextlib.suppress(OSError):
                    writer.close()
                return 0, 0
            writer.close()
        return 0, 0


def _exit_error() -> str:
    """At interpreter exit (the exit hooks run after the main thread stopped), the type of the
    uncaught exception the script died of, "" when it ended normally (or it is not exiting)."""
    if threading.main_thread().is_alive():
        return ""
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    return "" if exc is None else type(exc).__qualname__
