"""Local peers that do not hold the secret, and replays of signed messages: the collector holds
a bounded amount of memory for them, counts them, and still serves a good sender completely."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import subprocess
import sys
import threading
import time
from pathlib import Path

import zmq

from ddpviz import events as ev
from ddpviz.transport import Collector, Sender
from ddpviz.transport.codec import Codec, make_header
from ddpviz.transport.handshake import secure_client

ROOT = Path(__file__).resolve().parents[2]
BUDGET = 64 << 20  # what a peer without the secret may make the kernel hold
SLACK = 48 << 20  # allocator and zmq bookkeeping, loaded-machine noise
HANDSHAKE_END_S = 1.0  # after the attacker exits, its connections end within this


def _held() -> int:
    """RSS after handing freed memory back (a garbage collection, then glibc's malloc_trim):
    what the process still holds, not what its allocators keep cached for reuse (which grew
    with the number of threads that allocated at once on a loaded machine: +63 MiB once)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: RSS as it is
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return _rss()


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS in /proc/self/status")


def test_flood_without_the_secret_holds_bounded_memory_and_the_good_sender_gets_through():
    with Collector() as collector:
        n_events, done = 20_000, threading.Event()

        def good() -> None:  # streams through the whole attack
            with Sender(collector.connect_string, 3, batch=256) as sender:
                tap = ev.Tap(sender, 3)
                for i in range(n_events):
                    tap.emit(ev.GradReady, i, 0)
                    if i % 1000 == 0:
                        time.sleep(0.3)
            done.set()

        # The good sender is connected (handshake done, first events in) before the attack
        # starts and before the memory baseline: what it imports and allocates to get going
        # is not the attacker's, and a sender whose handshake lands mid-flood competes with
        # the attacker's pending connections (a limit stated in docs/security.md).
        worker = threading.Thread(target=good)
        worker.start()
        assert collector.wait(lambda s: s.received.get(3, 0) > 0, timeout=60)
        time.sleep(0.5)
        base = _held()
        attacker = subprocess.Popen(
            [sys.executable, "-m", "tests.transport.hostile_peer", "127.0.0.1",
             str(collector.port), "8"], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        peak = base
        while attacker.poll() is None:
            peak = max(peak, _rss())
            time.sleep(0.05)
        out, _ = attacker.communicate(timeout=30)
        pushed = int(out.split()[-1])
        worker.join(120)
        assert done.is_set()
        assert collector.wait(lambda s: 3 in s.closed, timeout=60)
        time.sleep(HANDSHAKE_END_S)  # every attacker connection is over by now
        after = _held()
        stats = collector.stats
        print(f"\nattacker pushed {pushed >> 20} MiB; collector RSS {base >> 20} MiB before, "
              f"peak +{(peak - base) >> 20} MiB, +{(after - base) >> 20} MiB after; "
              f"{stats.handshakes_failed} handshakes failed, {stats.pending_shut} pending shut")
        assert pushed > 4 * BUDGET  # the attack was real
        assert peak - base < BUDGET + SLACK
        assert after - base < SLACK
        assert stats.received == {3: n_events} and stats.gaps == {3: 0}
        assert stats.closed[3] == (n_events, 0)
        assert stats.handshakes_failed > 10
        assert stats.rejected["auth"] >= stats.handshakes_failed
        assert stats.total_rejected == stats.rejected["auth"]


def test_a_replayed_signed_frame_is_refused_and_counted():
    with Collector() as collector:
        codec = Codec(collector.secret.encode())
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 2000)
        secure_client(sock, collector.secret.encode())
        sock.connect(collector.address)
        evs = [ev.GradReady(0, 0, 1000 + s, s, 0, 0) for s in range(5)]
        captured = codec.encode(make_header("events", 0, "abc", 0, count=5), evs)
        sock.send_multipart(captured)
        assert collector.wait(lambda s: s.total_received == 5, timeout=10)
        for _ in range(3):  # the same bytes again: a replay
            sock.send_multipart(captured)
        more = [ev.GradReady(0, 0, 2000 + s, s, 0, 0) for s in range(5, 8)]
        sock.send_multipart(codec.encode(make_header("events", 0, "abc", 1, count=3, batch=1),
                                        more))
        sock.send_multipart(captured)  # and once more after a fresh frame
        assert collector.wait(lambda s: s.replays == 4, timeout=10)
        assert collector.wait(lambda s: s.total_received == 8, timeout=10)
        time.sleep(0.2)
        stats = collector.stats
        assert stats.received == {0: 8} and stats.reordered == {0: 0}
        assert stats.rejected["auth"] == 4 and stats.total_rejected == 4
        sock.close()


def test_an_event_over_the_message_limit_is_not_sent_and_the_stream_goes_on():
    import warnings

    from ddpviz.transport.codec import MAX_MESSAGE_BYTES

    with Collector() as collector:
        huge = ev.ParamsBuilt(0, 0, 0, 1, params=(), buffers=("x" * (MAX_MESSAGE_BYTES + 10),),
                              ignored=())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with Sender(collector.connect_string, 0) as sender:
                sender(ev.GradReady(0, 0, 1, 0, 0, 0))
                sender.flush()
                sender(huge)
                sender.flush()
                sender(ev.GradReady(0, 0, 2, 2, 0, 0))
        assert collector.wait(lambda s: 0 in s.closed, timeout=30)
        stats = collector.stats
        assert stats.received == {0: 2} and stats.gaps == {0: 1}  # the hole is visible
        assert stats.total_rejected == 0  # the connection was never dropped
        said = [str(w.message) for w in caught if "did not send a ParamsBuilt" in str(w.message)]
        assert len(said) == 1 and f"limited to {MAX_MESSAGE_BYTES} bytes" in said[0]


def test_a_connection_flood_never_loses_a_senders_events_silently():
    # A frame queued on a connection the guard then shut was lost (about one run in six on a
    # saturated machine) until batches were confirmed and resent ([Note: confirmed batches]).
    # Issue 23: bare connections opened thousands a second made the pending-handshake guard
    # shut a sender's connection after its messages were on the way (sent=2000, dropped=0,
    # 1024 or 2000 never arrived). Each try starts a sender mid-flood and emits its events at
    # once (two full messages); every event arrives or the sender counts it as dropped.
    import warnings

    n_events = 2000
    for _ in range(2):
        with Collector() as collector:
            flooder = subprocess.Popen(
                [sys.executable, "-m", "tests.transport.hostile_peer", "127.0.0.1",
                 str(collector.port), "3", "connections"],
                cwd=ROOT, stdout=subprocess.PIPE, text=True)
            assert collector.wait(lambda s: s.handshakes_failed + s.pending_shut > 100, 60)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a shed handshake may read as "refused"
                with Sender(collector.connect_string, 1) as sender:
                    tap = ev.Tap(sender, 1)
                    for i in range(n_events):
                        tap.emit(ev.GradReady, i, 0)
            rate = int(flooder.communicate(timeout=60)[0])
            assert collector.wait(lambda s: 1 in s.closed, timeout=60)
            stats, sent = collector.stats, sender.stats
            print(f"\n{rate} connections/s; {stats.pending_shut} shut, sender {sent}")
            assert stats.pending_shut > 0  # the guard was shedding connections meanwhile
            assert stats.closed[1] == (sent.sent, sent.dropped)
            assert stats.received.get(1, 0) == sent.sent
            assert stats.received.get(1, 0) - stats.dropped.get(1, 0) + sent.dropped \
                >= n_events
            assert stats.gaps.get(1, 0) == 0


def test_a_late_accepted_event_does_not_make_a_confirmed_connection_pending():
    # The monitor's ACCEPTED event can come after the connection's first message (and name a
    # descriptor by then reused): a connection that already spoke must never be shed.
    from ddpviz.transport.handshake import PendingGuard, secure_server

    ctx = zmq.Context()
    server = ctx.socket(zmq.ROUTER)
    secure_server(server, b"s")
    server.bind("tcp://127.0.0.1:*")
    guard = PendingGuard(server, max_pending=0)
    client = ctx.socket(zmq.DEALER)
    secure_client(client, b"s")
    client.connect(server.getsockopt(zmq.LAST_ENDPOINT).decode())
    client.send(b"hi")
    assert server.poll(10_000)
    frames = server.recv_multipart(copy=False)
    fd = frames[0].get(zmq.SRCFD)
    guard.confirm(fd)  # the message is read first ...
    guard.service()  # ... then its ACCEPTED event, and the cap (0) is applied
    guard._accepted(fd)  # (once more, as a late event naming the reused descriptor)
    guard.enforce()
    assert guard.pending == 0 and guard.shut == 0
    client.send(b"still here")
    assert server.poll(10_000) and server.recv_multipart()[1] == b"still here"
    guard.close()
    client.close(0)
    server.close(0)
    ctx.term()


def test_a_rank_with_the_wrong_secret_hears_it_before_close():
    import warnings

    from tests.polling import eventually

    with Collector() as collector:
        wrong = collector.connect_string.rsplit("#", 1)[0] + "#" + "ab" * 32
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sender = Sender(wrong, 0)
            ev.Tap(sender, 0).emit(ev.GradReady, 1, 0)
            assert eventually(lambda: any("refused this rank's key" in str(w.message)
                                          for w in caught), 60)
            sender.close(timeout=0.5)
        assert sender.stats.dropped == 1 and sender.stats.sent == 0
        assert collector.stats.received == {}
