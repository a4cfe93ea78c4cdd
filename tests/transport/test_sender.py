"""The rank side: overload is counted exactly and reported, flush/close semantics, file sink."""

from __future__ import annotations

import socket
import time

import pytest

from ddpviz import events as ev
from ddpviz.traces.trace import Trace
from ddpviz.transport import Collector, Sender


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_overload_is_counted_exactly_marked_in_the_stream_and_warned():
    produced = 200_000
    with Collector() as collector:
        got: list[ev.Event] = []
        collector.subscribe(got.extend, batch=True)
        with pytest.warns(UserWarning, match=r"ddpviz: rank 0 dropped \d+ events"):
            sender = Sender(collector.connect_string, 0, capacity=16, batch=8)
            tap = ev.Tap(sender, 0)
            for i in range(produced):
                tap.emit(ev.GradReady, i % 100, 0)
            sender.close()
        assert collector.wait(lambda s: 0 in s.closed, timeout=60)
        stats = collector.stats
    delivered = [e for e in got if type(e) is not ev.EventsDropped]
    markers = [e for e in got if type(e) is ev.EventsDropped]
    dropped = sum(m.count for m in markers)
    assert dropped > 0 and markers
    assert dropped + len(delivered) == produced
    assert sender.stats.dropped == dropped
    assert sender.stats.sent == len(got) and sender.stats.markers == len(markers)
    # The holes in the sequence are exactly the dropped events: each marker sits where its
    # hole begins and counts exactly the hole's length, so no hole is unexplained.
    assert stats.dropped[0] == dropped and stats.gaps[0] == 0
    assert stats.closed[0] == (len(got), dropped)
    seqs = [e.seq for e in delivered]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    expected = 0
    for e in got:
        if type(e) is ev.EventsDropped:
            assert e.seq == expected
            expected += e.count
        else:
            assert e.seq == expected
            expected += 1
    assert expected == produced


def test_flush_means_everything_emitted_so_far_was_shipped():
    with Collector() as collector, Sender(collector.connect_string, 1, batch=10) as sender:
        tap = ev.Tap(sender, 1)
        for round_ in range(1, 4):
            for i in range(333):
                tap.emit(ev.GradReady, i, 0)
            assert sender.flush(10)
            assert sender.stats.sent == 333 * round_
        assert collector.wait(lambda s: s.received.get(1) == 999, timeout=10)


def test_unreachable_collector_never_blocks_and_loss_is_counted_at_close():
    address = f"tcp://127.0.0.1:{_unused_port()}#" + "ab" * 32
    sender = Sender(address, 2, capacity=100)
    tap = ev.Tap(sender, 2)
    start = time.monotonic()
    for i in range(150):
        tap.emit(ev.GradReady, i, 0)
    emitted_in = time.monotonic() - start
    with pytest.warns(UserWarning, match=r"dropped \d+ events \(150 in total\)"):
        sender.close(timeout=0.3)
    assert sender.stats.dropped == 150 and sender.stats.sent == 0
    assert emitted_in < 5  # sanity only: 150 emits did not wait for the network
    tap.emit(ev.GradReady, 0, 0)  # after close: counted, not shipped, no error
    assert sender.stats.dropped == 151


def test_file_sender_records_a_loadable_trace(tmp_path):
    path = tmp_path / "rank3.ddpviz"
    with Sender.to_file(path, 3, batch=100) as sender:
        tap = ev.Tap(sender, 3)
        for i in range(1234):
            tap.emit(ev.GradReady, i, i % 4)
        assert sender.flush()
        # flushed batches are on disk already, before close
        assert len(Trace.load(path)) == 1234
    trace = Trace.load(path)
    assert [e.seq for e in trace.events(3)] == list(range(1234))
    assert trace.meta["rank"] == 3 and isinstance(trace.meta["mono_ns"], int)


def test_bad_arguments_are_user_errors():
    with pytest.raises(ValueError, match="capacity"):
        Sender("tcp://127.0.0.1:1#" + "ab" * 16, 0, capacity=0)
    with pytest.raises(ValueError, match="connect string"):
        Sender("nonsense", 0)
