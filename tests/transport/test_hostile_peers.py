"""Local peers that do not hold the secret, and replays of signed messages: the collector holds
a bounded amount of memory for them, counts them, and still serves a good sender completely."""

from __future__ import annotations

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
        # the attacker's pending connections (a limit stated in the README).
        worker = threading.Thread(target=good)
        worker.start()
        assert collector.wait(lambda s: s.received.get(3, 0) > 0, timeout=60)
        time.sleep(0.5)
        base = _rss()
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
        after = _rss()
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
        sock.send_multipart(codec.encode(make_header("events", 0, "abc", 1, count=3), more))
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
