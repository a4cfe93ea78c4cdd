"""[Note: confirmed batches] (sender.py): a batch lost with its connection is sent again on the
next one and delivered once; the collector confirms every batch, duplicates included."""

from __future__ import annotations

import threading
import time

import zmq

from ddpviz import events as ev
from ddpviz.transport import Collector, Sender
from ddpviz.transport.codec import Codec, WireError, make_header
from ddpviz.transport.handshake import secure_client, secure_server
from tests.polling import eventually

SECRET = "s3cret-for-resend-tests-0123456789"


def _events(seqs: range) -> list[ev.Event]:
    return [ev.GradReady(0, 0, 1000 + s, s, 0, 0) for s in seqs]


def test_a_resent_batch_is_delivered_once_and_confirmed_again():
    with Collector() as collector:
        codec = Codec(collector.secret.encode())
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        secure_client(sock, collector.secret.encode())
        sock.connect(collector.address)
        first = _events(range(5))
        for frame in range(2):  # batch 0 twice (as after a reconnect), new frame numbers
            sock.send_multipart(codec.encode(
                make_header("events", 0, "snd", frame, count=5, batch=0), first))
        sock.send_multipart(codec.encode(
            make_header("events", 0, "snd", 2, count=3, batch=1), _events(range(5, 8))))
        acks = []
        while len(acks) < 3:
            assert sock.poll(30_000), f"confirmations so far: {acks}"
            acks.append(codec.decode(sock.recv_multipart()).header)
        assert [(h.kind, h.batch) for h in acks] == [("ack", 0), ("ack", 0), ("ack", 1)]
        assert collector.wait(lambda s: s.total_received == 8, timeout=30)
        stats = collector.stats
        assert stats.received == {0: 8}  # batch 0's second copy was not delivered
        assert stats.gaps == {0: 0} and stats.reordered == {0: 0}
        sock.close()


class _OneShotCollector:
    """A collector that hangs up on the first connection as soon as a batch of events
    arrives on it (unconfirmed), then listens again on the same port and confirms."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.codec = Codec(SECRET.encode())
        self.port = 0
        self.first: list[int] = []  # batch numbers seen on the first connection
        self.second: list[int] = []  # ... and after it was replaced
        self.delivered: dict[int, list[int]] = {}  # batch -> event seqs (first copy)
        self.bye: tuple[int, int] | None = None
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(30)

    def _socket(self) -> zmq.Socket[bytes]:
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        secure_server(sock, SECRET.encode())
        return sock

    def _run(self) -> None:
        sock = self._socket()
        sock.bind("tcp://127.0.0.1:0")
        self.port = int(sock.getsockopt(zmq.LAST_ENDPOINT).decode().rsplit(":", 1)[1])
        self.ready.set()
        replaced = False
        while not self.stop.is_set():
            if not sock.poll(50):
                continue
            identity, *parts = sock.recv_multipart()
            try:
                frame = self.codec.decode(parts)
            except WireError:
                continue
            h = frame.header
            if h.kind == "hello":
                pong = make_header("pong", h.rank, h.sender, 0, t_ns=h.t_ns,
                                   peer_ns=time.monotonic_ns())
                sock.send_multipart([identity, *self.codec.encode(pong)])
            elif h.kind == "events":
                (self.second if replaced else self.first).append(h.batch)
                if not replaced:  # gone with the connection, never confirmed
                    sock.close(linger=0)
                    sock = self._socket()
                    deadline = time.monotonic() + 30
                    while True:  # the port frees at once on loopback; retry if not yet
                        try:
                            sock.bind(f"tcp://127.0.0.1:{self.port}")
                            break
                        except zmq.ZMQError:
                            assert time.monotonic() < deadline
                            time.sleep(0.05)
                    replaced = True
                    continue
                self.delivered.setdefault(h.batch, [e.seq for e in frame.events])
                ack = make_header("ack", h.rank, h.sender, 0, batch=h.batch)
                sock.send_multipart([identity, *self.codec.encode(ack)])
            elif h.kind == "bye":
                self.bye = (h.count, h.dropped)
                ack = make_header("ack", h.rank, h.sender, 0, batch=h.batch)
                sock.send_multipart([identity, *self.codec.encode(ack)])
        sock.close(linger=0)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)
        self.ctx.term()


def test_a_batch_lost_with_its_connection_is_resent_on_the_next_one():
    server = _OneShotCollector()
    try:
        n = 300
        with Sender(f"tcp://127.0.0.1:{server.port}#{SECRET}", 0) as sender:
            tap = ev.Tap(sender, 0)
            for i in range(n):
                tap.emit(ev.GradReady, i, 0)
        assert eventually(lambda: server.bye is not None, 30)
        # The first connection took a batch and died without confirming it: the same batch
        # number came again on the second connection, and every event arrived exactly once.
        assert server.first and server.first[0] in server.second
        seqs = sorted(s for batch in server.delivered.values() for s in batch)
        assert seqs == list(range(n))
        assert sender.stats.sent == n and sender.stats.dropped == 0
        assert server.bye == (n, 0)
    finally:
        server.close()
