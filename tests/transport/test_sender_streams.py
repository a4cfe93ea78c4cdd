"""Issue 37 (D2): acks confirm only batches that arrived, every sender keeps its own numbering
(See [Note: one stream per sender] in collector.py), a `bye` closes only a rank its sender spoke
for, and a followed file's header names a rank within the bounds of an event's."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import zmq

from ddpviz import events as ev
from ddpviz import limits
from ddpviz.session.follow import FolderFeed
from ddpviz.traces.fileformat import TraceWriter
from ddpviz.transport import Collector
from ddpviz.transport.codec import Codec, Header, Kind, make_header
from ddpviz.transport.handshake import secure_client


class _Peer:
    """A raw peer holding the secret; its frame numbers count up like a Sender's."""

    def __init__(self, collector: Collector, sender: str) -> None:
        self.codec = Codec(collector.secret.encode())
        self.sender, self.frame = sender, 0
        self.sock: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        secure_client(self.sock, collector.secret.encode())
        self.sock.connect(collector.address)

    def send(self, kind: Kind, rank: int, events: list[ev.Event] | None = None,
             **fields: int) -> None:
        evs = events or []
        if kind == "events":
            fields["count"] = len(evs)
        header = make_header(kind, rank, self.sender, self.frame, **fields)
        self.frame += 1
        self.sock.send_multipart(self.codec.encode(header, evs))

    def batch(self, rank: int, batch: int, seqs: range) -> None:
        self.send("events", rank, [ev.GradReady(rank, 0, 1000 + s, s, 0, 0) for s in seqs],
                  batch=batch)

    def acks(self, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n:
            assert self.sock.poll(30_000), f"confirmations so far: {out}"
            h: Header = self.codec.decode(self.sock.recv_multipart()).header
            assert h.kind == "ack"
            out.append(h.batch)
        return out

    def quiet(self) -> bool:
        """No message (an ack) comes within a while."""
        return not self.sock.poll(300)

    def close(self) -> None:
        self.sock.close()


def test_an_ack_confirms_only_the_batches_that_arrived():
    # Batch 1 goes missing and batch 2 comes first: its ack used to say "up to 2", so the
    # sender forgot batch 1, and batch 1 arriving after was taken for a duplicate: lost.
    with Collector() as collector:
        peer = _Peer(collector, "snd")
        peer.batch(0, 0, range(0, 5))
        assert peer.acks(1) == [0]
        peer.batch(0, 2, range(8, 10))  # ahead of the missing batch 1: delivered, unconfirmed
        assert peer.acks(1) == [0]
        peer.batch(0, 1, range(5, 8))  # the missing one: now 0..2 all arrived
        assert peer.acks(1) == [2]
        peer.batch(0, 2, range(8, 10))  # sent again (as its sender still held it): once
        assert peer.acks(1) == [2]
        assert collector.wait(lambda s: s.total_received == 10, timeout=30)
        time.sleep(0.2)
        stats = collector.stats
        assert stats.received == {0: 10} and stats.early_batches == 1
        # (counted in arrival order, as ever: seqs 5..7 were a gap, then came late)
        assert stats.gaps == {0: 3} and stats.reordered == {0: 3}
        peer.close()


def test_a_stream_delivers_a_bounded_number_of_batches_ahead_of_a_missing_one():
    from ddpviz.transport.collector import _MAX_AHEAD

    with Collector() as collector:
        peer = _Peer(collector, "snd")
        peer.batch(0, 0, range(0, 1))
        for b in range(2, _MAX_AHEAD + 3):  # batch 1 never comes
            peer.batch(0, b, range(b, b + 1))
        assert peer.acks(_MAX_AHEAD + 2) == [0] * (_MAX_AHEAD + 2)
        assert collector.wait(lambda s: s.early_batches == _MAX_AHEAD + 1, timeout=30)
        assert collector.stats.received == {0: 1 + _MAX_AHEAD}  # the last one: set aside
        peer.batch(0, 1, range(1, 2))
        assert peer.acks(1) == [_MAX_AHEAD + 1]  # the set-aside one was not confirmed
        peer.close()


def test_a_second_sender_for_a_rank_neither_resets_nor_borrows_the_first_ones_numbers():
    # A second sender id for rank 0 used to reset the rank's batch numbers: the first sender's
    # batch resent after that (as after a reconnect) was delivered twice.
    with Collector() as collector:
        first, second = _Peer(collector, "first"), _Peer(collector, "second")
        first.batch(0, 0, range(0, 5))
        assert first.acks(1) == [0]
        second.batch(0, 0, range(0, 3))  # its own batch 0 and seqs: a stream of its own
        assert second.acks(1) == [0]
        first.batch(0, 0, range(0, 5))  # resent: already delivered
        first.batch(0, 1, range(5, 7))
        assert first.acks(2) == [0, 1]
        second.batch(0, 1, range(3, 4))
        assert second.acks(1) == [1]
        assert collector.wait(lambda s: s.total_received == 11, timeout=30)
        stats = collector.stats
        assert stats.received == {0: 11}
        assert stats.gaps == {0: 0} and stats.reordered == {0: 0}
        first.close()
        second.close()


def test_a_bye_closes_only_a_rank_its_sender_spoke_for():
    with Collector() as collector:
        rank0, stranger = _Peer(collector, "rank0"), _Peer(collector, "stranger")
        rank0.batch(0, 0, range(0, 5))
        assert rank0.acks(1) == [0]
        stranger.send("bye", 0, count=0, dropped=0, batch=0)  # never spoke as rank 0
        rank0.send("bye", 1, count=0, dropped=0, batch=1)  # rank 0's sender, as rank 1
        assert collector.wait(lambda s: s.rejected["auth"] == 2, timeout=30)
        assert stranger.quiet() and rank0.quiet()  # neither confirmed
        assert collector.stats.closed == {}
        rank0.send("bye", 0, count=5, dropped=0, batch=1)
        assert rank0.acks(1) == [1]
        assert collector.wait(lambda s: s.closed == {0: (5, 0)}, timeout=30)
        assert collector.stats.total_rejected == 2
        rank0.close()
        stranger.close()


def test_a_followed_files_header_rank_is_bounded_like_an_events(tmp_path: Path):
    # The header's rank keys the session's per-rank state (peers, clocks, finished ranks):
    # rank 2**40 (or -1) showed up as a rank there.
    bad = (limits.MAX_WORLD_SIZE, -1)
    for i, rank in enumerate(bad):
        with TraceWriter(tmp_path / f"ddpviz-trace-rank{i}.ddpviz",
                         meta={"rank": rank, "host": "h", "pid": 1}) as w:
            w.write_many([ev.GradReady(0, 0, 1000, 0, 0, 0)])
    with TraceWriter(tmp_path / "ddpviz-trace-rank2.ddpviz",
                     meta={"rank": 2, "host": "h", "pid": 1}) as w:
        w.write_many([ev.GradReady(2, 0, 1000, 0, 0, 0)])
    feed = FolderFeed(tmp_path, interval=3600.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        feed.poll()
    try:
        stats = feed.stats
        assert set(stats.peers) == {2} and set(stats.clock) <= {2}
        assert stats.received == {2: 1}
        said = " ".join(str(w.message) for w in caught)
        for rank in bad:
            assert f"its header names rank {rank}, outside 0..{limits.MAX_WORLD_SIZE - 1}" \
                in said
    finally:
        feed.close()
