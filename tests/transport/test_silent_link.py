"""A link cut without a FIN or an RST (issue 37, M7): the Sender meets its close deadline, counts
what it could not deliver, notices the dead connection (heartbeats), and once the link is back
delivers every event exactly once (See [Note: a silent link] in handshake.py)."""

from __future__ import annotations

import time
import warnings

import pytest

from ddpviz import events as ev
from ddpviz.transport import Collector, Sender, handshake
from tests.polling import eventually
from tests.transport.silent_link import SilentLink


def _confirmed(sender: Sender) -> bool:
    """Every batch shipped so far is confirmed by the collector."""
    return not sender._sink._unconfirmed  # type: ignore[attr-defined]


def test_a_sender_on_a_silent_link_meets_its_close_deadline_and_counts_what_it_lost():
    # Issue 37 (M7): 2,000 events confirmed, silence, 5,000 more: close(10) returned after
    # 15 s with the shipping thread alive and stats.dropped == 0. Scaled down: 200 and 500.
    with Collector() as collector:
        link = SilentLink("127.0.0.1", collector.port)
        try:
            sender = Sender(f"{link.address}#{collector.secret}", 0, batch=64)
            tap = ev.Tap(sender, 0)
            for i in range(200):
                tap.emit(ev.GradReady, i, 0)
            assert sender.flush(60)
            assert eventually(lambda: _confirmed(sender), 60)
            link.freeze()  # no FIN, no RST: nothing more goes either way
            for i in range(500):
                tap.emit(ev.GradReady, i, 0)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                start = time.monotonic()
                sender.close(timeout=2.0)
                took = time.monotonic() - start
            print(f"\nclose(2.0) on a silent link returned after {took:.2f} s; {sender.stats}")
            assert not sender._thread.is_alive()  # gone by the deadline, not left waiting
            assert sender.stats.sent == 200 and sender.stats.dropped == 500
            said = [str(w.message) for w in caught if "dropped" in str(w.message)]
            assert said and "dropped 500 events (500 in total)" in said[-1]
        finally:
            link.close()


def test_heartbeats_notice_a_silent_link_and_the_link_back_delivers_exactly_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handshake, "LINK_PING_S", 0.1)
    monkeypatch.setattr(handshake, "LINK_TIMEOUT_S", 1.0)
    n = 500
    with Collector() as collector:
        got: list[ev.Event] = []
        collector.subscribe(got.extend, batch=True)
        link = SilentLink("127.0.0.1", collector.port)
        try:
            sender = Sender(f"{link.address}#{collector.secret}", 0, batch=64)
            sink = sender._sink
            tap = ev.Tap(sender, 0)
            for i in range(200):
                tap.emit(ev.GradReady, i, 0)
            assert sender.flush(60)
            assert eventually(lambda: _confirmed(sender), 60)
            link.freeze()
            for i in range(200, n):  # shipped onto the dead connection, never confirmed
                tap.emit(ev.GradReady, i, 0)
            # Without heartbeats the dead connection stayed up for good: no disconnect at all.
            assert eventually(lambda: sink.disconnects >= 1, 60)  # type: ignore[attr-defined]
            assert not _confirmed(sender)
            link.thaw()
            # On the new connection the sender greets and resends what was cut off, idle as
            # it is (a job that hangs emits nothing more, and those are the events wanted).
            assert collector.wait(lambda s: s.received.get(0) == n, timeout=60)
            sender.close(timeout=60)
            assert collector.wait(lambda s: 0 in s.closed, timeout=60)
            stats = collector.stats
        finally:
            link.close()
    assert link.accepted >= 2  # it connected again through the link
    seqs = [e.seq for e in got]
    assert sorted(seqs) == list(range(n))  # every event, each once
    assert sender.stats.sent == n and sender.stats.dropped == 0
    assert stats.received == {0: n} and stats.gaps == {0: 0} and stats.reordered == {0: 0}
    assert stats.closed[0] == (n, 0)
