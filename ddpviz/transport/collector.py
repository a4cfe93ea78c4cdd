"""The kernel side of the event stream: a `Collector` receives every rank's events.

One zmq ROUTER socket, bound to 127.0.0.1 unless told otherwise, served by one background
thread. Only peers holding the session secret get through zmq's handshake (See [Note: transport
authentication] in handshake.py). Every message is then checked by the codec (signature with the
per-session secret first) and must carry a frame number above the last one from its sender
(a replayed message is refused as "auth"); refused ones are counted per reason and the thread
carries on. It answers clock pings (See
[Note: clock alignment] in sender.py), finds holes in each rank's sequence numbers, and hands
events to subscribers: callbacks run on its thread, `events()` iterates from any thread.
"""

from __future__ import annotations

import contextlib
import queue
import secrets
import socket
import threading
import time
import uuid
import warnings
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import zmq

from ddpviz.debugger.protocol import MAX_COMMANDS, Command
from ddpviz.events import Event, EventsDropped
from ddpviz.interrupts import interrupts_deferred
from ddpviz.transport.codec import (
    MAX_FRAME_SLACK,
    MAX_MESSAGE_BYTES,
    REASONS,
    Codec,
    Header,
    WireError,
    boot_id,
    make_header,
)
from ddpviz.transport.handshake import MAX_PENDING, PendingGuard, secure_server, watch_link
from ddpviz.transport.subscribers import Subscribers, deliver

_WILDCARD_HOSTS = ("0.0.0.0", "*", "::", "")
END_OF_STREAM = object()  # put on an iterate_queue queue to end the iteration
_MAX_SENDERS = 1 << 16  # senders whose last frame number is kept (for replay checks), and
#                         (sender, rank) streams whose numbering is kept
_MAX_CONFIRMED = 1 << 16  # connections remembered as past their handshake (then forgotten)
_MAX_AHEAD = 64  # batches a stream may have delivered ahead of a missing one (a Sender: none)


class CollectorStats(NamedTuple):
    """A snapshot of what the collector has seen, per rank unless noted."""

    received: dict[int, int]  #: events accepted (EventsDropped markers included)
    frames: dict[int, int]  #: event messages accepted
    rejected: dict[str, int]  #: messages refused, per reason (every reason in codec.REASONS)
    gaps: dict[int, int]  #: seq numbers never received nor explained by an EventsDropped marker
    #                       (silent loss, which should stay 0)
    dropped: dict[int, int]  #: events the rank's sender reported dropped (EventsDropped)
    reordered: dict[int, int]  #: events whose seq went backwards (duplicates, a second Tap)
    lost_frames: dict[int, int]  #: messages missing from a sender's frame numbering
    clock: dict[int, tuple[int, int]]  #: (offset_ns, error_ns); error -1 for a wall-clock estimate
    peers: dict[int, str]  #: "host pid" from the rank's hello
    closed: dict[int, tuple[int, int]]  #: ranks that said goodbye, with (events sent, dropped)
    callback_errors: int  #: exceptions raised by subscribers (the first one is warned about)
    replays: int = 0  #: signed messages refused for a frame number already seen (in "auth")
    handshakes_failed: int = 0  #: connections that failed zmq's handshake (in "auth")
    pending_shut: int = 0  #: connections shut for being over the cap mid-handshake
    early_batches: int = 0  #: event batches that arrived ahead of a missing one (never from a
    #                          ddpviz Sender: See [Note: one stream per sender] in collector.py)

    @property
    def total_received(self) -> int:
        """Events accepted from all ranks together."""
        return sum(self.received.values())

    @property
    def total_rejected(self) -> int:
        """Messages refused for any reason (the sum of `rejected`)."""
        return sum(self.rejected.values())


@dataclass
class _RankState:
    sender: str = ""  # the sender id of the rank's last message
    received: int = 0
    frames: int = 0
    gaps: int = 0
    dropped: int = 0
    reordered: int = 0
    lost_frames: int = 0
    clock: tuple[int, int] | None = None
    peer: str = ""
    closed: tuple[int, int] | None = None


# [Note: one stream per sender]
# A rank's messages normally come from one Sender (a restarted rank: a new one, with a new id).
# Its numbers (frames, event seqs, batches) count on from its own previous message, so the
# collector keeps them per (sender id, rank) stream: a second sender speaking for the same
# rank, hostile or mistaken, neither resets nor borrows another stream's numbers (it used to
# reset the rank's, so a batch resent after that was delivered twice). The rank's totals
# (received, gaps, ...) add up over its streams. An ack confirms a stream's contiguous prefix of
# batches (cumulative: See [Note: confirmed batches] in sender.py), never a batch that did not
# arrive: a batch ahead of a missing one (stats.early_batches) is delivered (once: its number is
# kept) but confirmed only once the missing one has arrived; beyond _MAX_AHEAD such batches a
# stream's next one is set aside unconfirmed, for its sender to send again. The prefix begins at
# the stream's first batch: a Sender's first batch on any connection is its oldest unconfirmed
# one, so a collector started again with the same secret and port takes a running job's senders
# over where they are. A ddpviz Sender never sends a batch ahead of a missing one: it sends them
# in order, from the oldest unconfirmed on every new connection, and a frame of an old
# connection arriving after a newer one is refused as a replay. A `bye` closes a rank only for a
# sender that spoke for that rank before (others are refused as "auth"); the rank's `closed`
# resets when another sender speaks for it.


@dataclass
class _Stream:
    """One sender's numbering as one rank (See [Note: one stream per sender])."""

    next_frame: int  # next expected frame number
    next_seq: int = 0  # next expected event seq
    next_batch: int | None = None  # batches below it all arrived; None before the first
    ahead: set[int] | None = None  # batches above it that arrived (None: none)


class Collector:
    """Receives events from every rank over zmq, validated and signed.

    Args:
        host: interface to bind; loopback by default. Pass "0.0.0.0" (or an address) to accept
            ranks on other machines; the secret still guards it, but the traffic is not
            encrypted.
        port: TCP port; 0 picks a free one.
        secret: the session secret (hex text); a fresh random one by default.
        advertise: host name put in the connect string (default: `host`, or this machine's
            name when binding every interface).
        max_bytes: messages larger than this are refused as "oversized".
        max_pending: connections allowed mid-handshake at once (See [Note: transport
            authentication]); a peer without the secret makes the kernel hold at most about
            `max_pending * max_bytes` bytes.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, secret: str | None = None, *,
                 advertise: str | None = None, max_bytes: int = MAX_MESSAGE_BYTES,
                 max_pending: int = MAX_PENDING) -> None:
        # An interrupt waits until the socket and its thread exist (or the error is raised): a
        # half-made collector's socket, closed later by garbage collection under its thread's
        # poll, hung or crashed the kernel (See interrupts.py).
        with interrupts_deferred():
            self._open(host, port, secret, advertise, max_bytes, max_pending)

    def _open(self, host: str, port: int, secret: str | None, advertise: str | None,
              max_bytes: int, max_pending: int) -> None:
        self.secret = secret or secrets.token_hex(32)
        self._codec = Codec(self.secret.encode(), max_bytes=max_bytes)
        self._codec_out = Codec(self.secret.encode())  # send_control's, under self._lock
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        # zmq disconnects a peer sending one frame beyond this, before we could count it; it is
        # also the most a peer mid-handshake (not yet authenticated) can make zmq buffer.
        sock.setsockopt(zmq.MAXMSGSIZE, max_bytes + MAX_FRAME_SLACK)
        sock.setsockopt(zmq.RCVHWM, 1024)
        secure_server(sock, self.secret.encode())
        watch_link(sock, client=False)
        self._guard = PendingGuard(sock, max_pending)
        self._confirmed: set[bytes] = set()  # ROUTER identities whose handshake is known over
        host = "127.0.0.1" if host == "localhost" else host
        ipv6 = ":" in host
        if ipv6:
            sock.setsockopt(zmq.IPV6, 1)
        bind_host = "*" if host in _WILDCARD_HOSTS else (f"[{host}]" if ipv6 else host)
        try:
            sock.bind(f"tcp://{bind_host}:{port or '*'}")
        except zmq.ZMQError as e:
            self._guard.close()
            sock.close()
            self._ctx.term()
            raise OSError(f"ddpviz: cannot listen on {host}:{port}: {e}.\nPick another port "
                          "(port=0 takes a free one) or an address of this machine.") from e
        endpoint = sock.getsockopt(zmq.LAST_ENDPOINT)
        assert isinstance(endpoint, bytes)
        self.port = int(endpoint.decode().rsplit(":", 1)[1])
        self.host = host
        shown = advertise or (socket.gethostname() if host in _WILDCARD_HOSTS else host)
        self.address = f"tcp://[{shown}]:{self.port}" if ":" in shown else \
            f"tcp://{shown}:{self.port}"
        self._sock = sock
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)
        self._ranks: dict[int, _RankState] = {}
        self._rejected = dict.fromkeys(REASONS, 0)
        self._senders: dict[str, int] = {}  # sender id -> next frame number it may send
        self._streams: dict[tuple[str, int], _Stream] = {}  # (sender id, rank), by last use
        self._early_batches = 0
        self._replays = 0
        self._callback_errors = 0
        self._internal_errors = 0
        self._subscribers = Subscribers()
        self._id = uuid.uuid4().hex  # signed into control headers (the rank's replay check)
        self._control_seq = 0
        self._identities: dict[int, bytes] = {}  # rank -> the connection its Sender spoke on
        self._outbox: queue.SimpleQueue[tuple[bytes, list[bytes]]] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ddpviz-collector", daemon=True)
        self._thread.start()

    @property
    def connect_string(self) -> str:
        """What a rank needs to send here: `tcp://HOST:PORT#SECRET` (keep it private)."""
        return f"{self.address}#{self.secret}"

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    # --- consumers ----------------------------------------------------------------------------

    def subscribe(self, callback: Callable[[Any], None], *, batch: bool = False
                  ) -> Callable[[], None]:
        """Call `callback(event)` for every accepted event (or `callback(list_of_events)` per
        message with batch=True), on the collector's thread. Returns an unsubscribe function.
        Exceptions from callbacks are counted in stats.callback_errors, never fatal."""
        return self._subscribers.add(callback, batch=batch)

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Iterate over events as they arrive (from this call on), from any thread. Ends when
        the collector closes, or after `timeout` seconds without an event."""
        q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        unsubscribe = self._subscribers.add(q.put, batch=True,
                                            on_close=lambda: q.put(END_OF_STREAM))
        if self.closed:
            q.put(END_OF_STREAM)
        return iterate_queue(q, unsubscribe, timeout)

    def send_control(self, rank: int | None, commands: list[Command]) -> tuple[int, ...]:
        """Send the debugger's `commands` (ddpviz.debugger.protocol) to `rank` (None: every rank
        whose Sender has spoken here and not said goodbye), signed, over the connection that
        rank's Sender opened (a rank never listens). Returns the ranks it went to; raises
        ValueError for a rank that never connected or too many commands. Any thread."""
        if not 0 < len(commands) <= MAX_COMMANDS:
            raise ValueError(f"ddpviz: send_control takes 1 to {MAX_COMMANDS} commands, got "
                             f"{len(commands)}; send them in several calls.")
        with self._lock:
            if rank is None:
                closed = {k for k, st in self._ranks.items() if st.closed is not None}
                targets = {k: i for k, i in self._identities.items() if k not in closed}
            elif rank in self._identities:
                targets = {rank: self._identities[rank]}
            else:
                raise ValueError(f"ddpviz: rank {rank} has not connected to this collector "
                                 f"(connected: {sorted(self._identities)}); wait for its first "
                                 "events, or check the rank number.")
            for r, identity in sorted(targets.items()):
                header = make_header("control", r, self._id, self._control_seq,
                                     count=len(commands))
                self._control_seq += 1
                self._outbox.put((identity, self._codec_out.encode(header, list(commands))))
        return tuple(sorted(targets))

    def _send_outbox(self) -> None:
        """On the collector's thread (the socket's owner): send what send_control queued."""
        while True:
            try:
                identity, parts = self._outbox.get_nowait()
            except queue.Empty:
                return
            with contextlib.suppress(zmq.ZMQError):  # the rank went away: nothing to control
                self._sock.send_multipart([identity, *parts], zmq.NOBLOCK)

    @property
    def stats(self) -> CollectorStats:
        with self._lock:
            r = self._ranks
            return CollectorStats(
                received={k: s.received for k, s in r.items()},
                frames={k: s.frames for k, s in r.items()},
                rejected=dict(self._rejected),
                gaps={k: s.gaps for k, s in r.items()},
                dropped={k: s.dropped for k, s in r.items()},
                reordered={k: s.reordered for k, s in r.items()},
                lost_frames={k: s.lost_frames for k, s in r.items()},
                clock={k: s.clock for k, s in r.items() if s.clock is not None},
                peers={k: s.peer for k, s in r.items()},
                closed={k: s.closed for k, s in r.items() if s.closed is not None},
                callback_errors=self._callback_errors,
                replays=self._replays,
                handshakes_failed=self._guard.failed,
                pending_shut=self._guard.shut,
                early_batches=self._early_batches)

    def wait(self, predicate: Callable[[CollectorStats], bool], timeout: float = 30.0) -> bool:
        """Block until `predicate(stats)` holds (checked after every message); False on
        timeout."""
        deadline = time.monotonic() + timeout
        while not predicate(self.stats):
            left = deadline - time.monotonic()
            if left <= 0 or self.closed:
                return predicate(self.stats)
            with self._cv:
                self._cv.wait(min(left, 0.05))
        return True

    def close(self) -> None:
        """Stop receiving; iterators end. Idempotent."""
        with interrupts_deferred():  # the socket closes only after its thread has stopped
            if self._stop.is_set():
                return
            self._stop.set()
            self._thread.join(10)
            if not self._thread.is_alive():  # else stuck in a callback: never close under it
                self._guard.close()
                self._sock.close(linger=0)
                self._ctx.term()
            self._subscribers.close()

    def __enter__(self) -> Collector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        s = self.stats
        return (f"<ddpviz Collector {self.address}: {s.total_received} events from ranks "
                f"{sorted(s.received)}, {s.total_rejected} rejected>")

    # --- the receiving thread -----------------------------------------------------------------

    def _run(self) -> None:
        sock, guard = self._sock, self._guard
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        poller.register(guard.monitor, zmq.POLLIN)
        while not self._stop.is_set():
            self._send_outbox()
            ready = dict(poller.poll(10 if self._outbox.empty() else 0))
            if guard.monitor in ready or guard.pending:
                # Read the monitor now, apply the cap after this round's messages: a connection
                # whose first message is waiting has finished its handshake and must not be
                # shut as pending (at 256 ranks connecting at once, that lost their hellos).
                failed = guard.service(enforce=False)
                if failed:
                    with self._lock:
                        self._rejected["auth"] += failed
            if sock not in ready:
                guard.enforce()
                continue
            for _ in range(256):
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                msg = [f.bytes for f in frames]
                if msg[0] not in self._confirmed:
                    # Its handshake is over: off the pending list for good (its ACCEPTED
                    # event may still be on its way), so that a flood of new connections can
                    # never shut an established sender down (See [Note: which connection is
                    # pending] in handshake.py).
                    guard.confirm(frames[0].get(zmq.SRCFD))
                    if len(self._confirmed) >= _MAX_CONFIRMED:
                        self._confirmed.clear()
                    self._confirmed.add(msg[0])
                try:
                    self._handle(msg, time.monotonic_ns())
                except Exception as exc:  # a bug must not stop the stream: say so, go on
                    self._internal_error(exc)
            guard.enforce()
            with self._cv:
                self._cv.notify_all()

    def _handle(self, msg: list[bytes], t_recv: int) -> None:
        identity, parts = msg[0], msg[1:]
        try:
            frame = self._codec.decode(parts)
        except WireError as e:
            with self._lock:
                self._rejected[e.reason] += 1
            return
        h, events = frame.header, frame.events
        with self._lock:
            if h.seq < self._senders.get(h.sender, 0):
                self._rejected["auth"] += 1  # a replay: signed, but not fresh
                self._replays += 1
                return
            self._senders.pop(h.sender, None)  # re-insert: the dict's order is by last use
            self._senders[h.sender] = h.seq + 1
            if len(self._senders) > _MAX_SENDERS:
                del self._senders[next(iter(self._senders))]
            if h.kind in ("hello", "events", "ping"):
                self._identities[h.rank] = identity  # where control for this rank goes
        if h.kind == "control":  # only a collector sends control: a peer has no standing
            with self._lock:
                self._rejected["auth"] += 1
            return
        if h.kind == "events":
            self._ack(identity, h, self._accept(h, events))
            return
        confirm: int | None = None
        with self._lock:
            if h.kind == "bye" and (h.sender, h.rank) not in self._streams:
                # Not a sender of this rank: it cannot close it (See [Note: one stream per
                # sender]); signed, but without standing.
                self._rejected["auth"] += 1
                return
            st, stream = self._state(h)
            if h.kind == "hello":
                st.peer = f"{h.host} {h.pid}"
                if h.boot and h.boot == boot_id():
                    st.clock = (0, 0)  # same kernel, same monotonic clock: exact
                elif st.clock is None:
                    # Until a ping answers: compare wall clocks (error: the hosts' NTP error).
                    st.clock = ((time.time_ns() - t_recv) - (h.wall_ns - h.t_ns), -1)
            elif h.kind == "clock":
                if st.clock is None or st.clock[1] < 0 or 0 <= h.error_ns < st.clock[1]:
                    st.clock = (h.offset_ns, h.error_ns)
            elif h.kind == "bye":
                st.closed = (h.count, h.dropped)
                # A bye carries the number after its sender's last batch: confirmed (with every
                # batch below it) only when all of them arrived.
                nxt = stream.next_batch
                confirm = h.batch if nxt is None or nxt == h.batch else nxt - 1
        if h.kind == "bye":
            self._ack(identity, h, confirm)
        if h.kind in ("hello", "ping"):
            pong = make_header("pong", h.rank, h.sender, 0, t_ns=h.t_ns, peer_ns=t_recv)
            # If the peer went away the pong is lost; it pings again if it still cares.
            with contextlib.suppress(zmq.ZMQError):
                self._sock.send_multipart([identity, *self._codec.encode(pong)], zmq.NOBLOCK)

    def _state(self, h: Header) -> tuple[_RankState, _Stream]:
        """The rank's state and the sender's stream as that rank (See [Note: one stream per
        sender]); the rank's `closed` resets when another Sender (a restarted rank) speaks."""
        st = self._ranks.get(h.rank)
        if st is None:
            st = self._ranks[h.rank] = _RankState()
        if st.sender != h.sender:
            st.sender, st.closed = h.sender, None
        key = (h.sender, h.rank)
        stream = self._streams.pop(key, None)  # re-inserted: the dict's order is by last use
        if stream is None:
            stream = _Stream(next_frame=h.seq)
            if len(self._streams) >= _MAX_SENDERS:
                del self._streams[next(iter(self._streams))]
        self._streams[key] = stream
        if h.seq > stream.next_frame:
            st.lost_frames += h.seq - stream.next_frame
        stream.next_frame = max(stream.next_frame, h.seq + 1)
        return st, stream

    def _ack(self, identity: bytes, h: Header, batch: int | None) -> None:
        """Confirm `batch` and every one before it (None: nothing to confirm): the sender
        resends what is unconfirmed when its connection is replaced (See [Note: confirmed
        batches] in sender.py)."""
        if batch is None:
            return
        ack = make_header("ack", h.rank, h.sender, 0, batch=batch)
        with contextlib.suppress(zmq.ZMQError):  # lost with its connection: resent, re-acked
            self._sock.send_multipart([identity, *self._codec.encode(ack)], zmq.NOBLOCK)

    def _accept(self, h: Header, events: list[Event]) -> int:
        """Deliver a batch that extends its stream's prefix (once); returns the prefix's last
        batch, what the ack confirms (See [Note: one stream per sender])."""
        with self._lock:
            st, stream = self._state(h)
            if stream.next_batch is None:
                stream.next_batch = h.batch  # its oldest unconfirmed: the prefix begins here
            batch, ahead = h.batch, stream.ahead
            if batch < stream.next_batch or (ahead is not None and batch in ahead):
                return stream.next_batch - 1  # resent after a reconnect: delivered once
            if batch > stream.next_batch:  # one before it is missing: not confirmed yet
                self._early_batches += 1
                if ahead is None:
                    ahead = stream.ahead = set()
                if len(ahead) >= _MAX_AHEAD:
                    return stream.next_batch - 1  # set aside: its sender keeps it
                ahead.add(batch)
            else:
                stream.next_batch += 1
                while ahead is not None and stream.next_batch in ahead:
                    ahead.discard(stream.next_batch)
                    stream.next_batch += 1
                if not ahead:
                    stream.ahead = None
            nxt, gaps, dropped, reordered = stream.next_seq, 0, 0, 0
            for e in events:
                s = e.seq
                if type(e) is EventsDropped:
                    # Its seq is where the sender's hole begins; the hole is explained, not a gap.
                    dropped += e.count
                    if s > nxt:
                        gaps += s - nxt
                    nxt = max(nxt, s + e.count)
                    continue
                if s == nxt:
                    nxt += 1
                elif s > nxt:
                    gaps += s - nxt
                    nxt = s + 1
                else:
                    reordered += 1
            stream.next_seq = nxt
            confirmed = stream.next_batch - 1
            st.gaps += gaps
            st.dropped += dropped
            st.reordered += reordered
            st.received += len(events)
            st.frames += 1
            subscribers = self._subscribers.current  # those subscribed when it was counted
        deliver(subscribers, events, self.report_callback_error)
        return confirmed

    def _internal_error(self, exc: Exception) -> None:
        with self._lock:
            self._internal_errors += 1
            first = self._internal_errors == 1
        if first:
            with contextlib.suppress(Warning):
                warnings.warn(f"ddpviz: the collector failed on a message ({type(exc).__name__}:"
                              f" {exc}); it skipped it and keeps running.\nPlease report this "
                              "as a ddpviz bug.", UserWarning, stacklevel=2)

    def report_callback_error(self, callback: object, exc: Exception) -> None:
        """Count a consumer's exception (and warn about the first); the stream goes on."""
        with self._lock:
            self._callback_errors += 1
            first = self._callback_errors == 1
        if first:
            warn_callback_error(callback, exc, "the collector keeps running")


def warn_callback_error(callback: object, exc: Exception, goes_on: str) -> None:
    """Say that a subscriber raised (the first time; later ones are only counted)."""
    with contextlib.suppress(Warning):  # warnings-as-errors must not kill the thread
        warnings.warn(f"ddpviz: a subscriber ({callback!r}) raised {type(exc).__name__}: "
                      f"{exc}; later errors are only counted in stats.callback_errors.\nFix "
                      f"the callback; {goes_on}.", UserWarning, stacklevel=3)


def iterate_queue(q: queue.SimpleQueue[Any], unsubscribe: Callable[[], None],
                  timeout: float | None) -> Iterator[Event]:
    """Yield the events of the batches put on `q` until END_OF_STREAM or `timeout` seconds of quiet;
    unsubscribes when exhausted, closed or garbage collected (even if never started)."""
    it = _iterate(q, timeout)
    weakref.finalize(it, unsubscribe)
    return it


def _iterate(q: queue.SimpleQueue[Any], timeout: float | None) -> Iterator[Event]:
    while True:
        try:
            item = q.get(timeout=timeout)
        except queue.Empty:
            return
        if item is END_OF_STREAM:
            return
        yield from item
