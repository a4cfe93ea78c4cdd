"""The collector on loopback: exact rejection counts under fuzzing, gaps, clocks, consumers."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import msgspec
import pytest
import zmq

from ddpviz import events as ev
from ddpviz.transport import REASONS, Collector, Sender
from ddpviz.transport.codec import MAGIC, Codec, make_header
from ddpviz.transport.handshake import secure_client


def _dealer(address: str, secret: str) -> zmq.Socket[bytes]:
    """A raw socket of a peer that holds the secret (it passes zmq's CURVE handshake)."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 2000)
    secure_client(sock, secret.encode())
    sock.connect(address)
    return sock


def _good_events(rank: int, seqs: list[int]) -> list[ev.Event]:
    return [ev.GradReady(rank, 0, 1000 + s, s, s % 5, 0) for s in seqs]


def _malformed(kind: str, rng: random.Random, codec: Codec, limit: int) -> list[bytes]:
    """One message that must be refused for the reason named by `kind` (its key below)."""
    enc = msgspec.msgpack.Encoder()
    evs = _good_events(0, list(range(rng.randint(1, 20))))
    head = enc.encode(make_header("events", 0, "fuzz", 0, count=len(evs)))
    body = enc.encode(evs)

    def signed(h: bytes, b: bytes) -> list[bytes]:
        return [MAGIC, codec.sign(h, b), h, b]

    def noise(lo: int, hi: int) -> bytes:
        return rng.randbytes(rng.randint(lo, hi))

    if kind == "garbage:random":  # random frames that do not start with the magic
        parts = [noise(0, 300) for _ in range(rng.randint(1, 5))]
        if parts[0] == MAGIC:
            parts[0] = b"x"
        return parts
    if kind == "garbage:frames":
        return [MAGIC, *(noise(0, 50) for _ in range(rng.randint(4, 7)))]
    if kind == "garbage:msgpack":  # signed, but not msgpack at all
        return signed(head, b"\xc1" + noise(0, 100))
    if kind == "truncated:frames":
        return [MAGIC, *(noise(0, 50) for _ in range(rng.randint(0, 2)))]
    if kind == "truncated:body":  # a buggy peer with the secret cut its body short
        return signed(head, body[:rng.randint(0, len(body) - 1)])
    if kind == "oversized":
        return [MAGIC, noise(64, 64), head, rng.randbytes(limit + rng.randint(1, 100_000))]
    if kind == "auth:bad-signature":
        return [MAGIC, rng.randbytes(32).hex().encode(), head, body]
    if kind == "auth:cut-after-signing":
        good = signed(head, body)
        return [*good[:3], body[:rng.randint(0, len(body) - 1)]]
    if kind == "auth:other-secret":
        other = Codec(rng.randbytes(32).hex().encode())
        return other.encode(make_header("events", 0, "fuzz", 0, count=len(evs)), evs)
    if kind == "auth:unsigned":
        return [MAGIC, b"", head, body]
    if kind == "version":
        h = dict(msgspec.to_builtins(make_header("ping", 0, "fuzz", 0)))
        h[rng.choice(["version", "schema"])] += rng.randint(1, 1000)
        return signed(enc.encode(h), enc.encode([]))
    if kind == "schema":
        choices = [
            enc.encode([1, 2, 3]),
            enc.encode({"not": "a list"}),
            enc.encode([{"type": "GradReady", "rank": 0}]),
            enc.encode([{"type": "NoSuchEvent", "rank": 0, "step": 0, "t_ns": 0, "seq": 0}]),
            enc.encode([{**msgspec.to_builtins(evs[0]), "param": "not an int"}]),
            enc.encode(noise(0, 40).hex()),
        ]
        if rng.random() < 0.3:  # or a header of the wrong shape
            h = dict(msgspec.to_builtins(make_header("events", 0, "fuzz", 0)))
            h[rng.choice(["kind", "rank", "seq"])] = rng.choice(["nope", -0.5, [1]])
            return signed(enc.encode(h), body)
        return signed(head, rng.choice(choices))
    raise AssertionError(kind)


KINDS = ["garbage:random", "garbage:frames", "garbage:msgpack", "truncated:frames",
         "truncated:body", "oversized", "auth:bad-signature", "auth:cut-after-signing",
         "auth:other-secret", "auth:unsigned", "version", "schema"]


def test_fuzz_exact_rejection_counts_and_survives():
    limit = 64 << 10
    rng = random.Random(20261104)
    with Collector(max_bytes=limit) as collector:
        codec = Codec(collector.secret.encode())
        sock = _dealer(collector.address, collector.secret)
        expected: Counter[str] = Counter()
        oversized = 0
        for i in range(3600):
            kind = KINDS[i % len(KINDS)] if i < 2400 else rng.choice(KINDS)
            if kind == "oversized":  # keep the volume modest: every 2nd becomes "version"
                oversized += 1
                kind = "oversized" if oversized % 2 else "version"
            sock.send_multipart(_malformed(kind, rng, codec, limit))
            expected[kind.split(":")[0]] += 1
        total = sum(expected.values())
        assert collector.wait(lambda s: s.total_rejected >= total, timeout=60)
        stats = collector.stats
        assert stats.rejected == {r: expected[r] for r in REASONS}
        assert all(expected[r] > 100 for r in REASONS)
        assert stats.total_received == 0 and stats.received == {}
        sock.close()

        # ... and a good sender is still served afterwards, completely.
        with Sender(collector.connect_string, 7, batch=256) as sender:  # < the 64 KiB limit
            tap = ev.Tap(sender, 7)
            for i in range(5000):
                tap.emit(ev.GradReady, i, 0)
        assert collector.wait(lambda s: 7 in s.closed, timeout=30)
        stats = collector.stats
        assert stats.received == {7: 5000} and stats.gaps == {7: 0}
        assert stats.closed[7] == (5000, 0)
        assert stats.rejected == {r: expected[r] for r in REASONS}


def test_peer_without_the_secret_delivers_nothing():
    with Collector() as collector:
        intruder = collector.connect_string.rsplit("#", 1)[0] + "#" + "00" * 32
        with Sender(intruder, 0) as sender:
            tap = ev.Tap(sender, 0)
            for i in range(100):
                tap.emit(ev.GradReady, i, 0)
        assert collector.wait(lambda s: s.rejected["auth"] >= 2, timeout=10)
        time.sleep(0.2)
        stats = collector.stats
        assert stats.received == {} and stats.clock == {}
        assert set(stats.rejected) == set(REASONS)
        assert sum(stats.rejected.values()) == stats.rejected["auth"]


def test_gaps_and_reordering_are_counted_per_rank():
    with Collector() as collector:
        codec = Codec(collector.secret.encode())
        sock = _dealer(collector.address, collector.secret)
        batches = {0: [list(range(10)), list(range(15, 20)), [3], list(range(20, 25))],
                   1: [list(range(8)), list(range(8, 16))]}
        for rank, seqs_list in batches.items():
            for frame, seqs in enumerate(seqs_list):
                if rank == 0 and frame >= 2:
                    frame += 1  # rank 0's third message is numbered 3: message 2 went missing
                evs = _good_events(rank, seqs)
                sock.send_multipart(codec.encode(
                    make_header("events", rank, f"s{rank}", frame, count=len(evs), batch=frame),
                    evs))
        assert collector.wait(lambda s: s.total_received == 37, timeout=10)
        stats = collector.stats
        assert stats.received == {0: 21, 1: 16}
        assert stats.gaps == {0: 5, 1: 0}
        assert stats.reordered == {0: 1, 1: 0}
        assert stats.lost_frames == {0: 1, 1: 0}
        sock.close()


def test_clock_offset_of_a_skewed_rank_is_found_within_its_error_bound():
    skew = 5_000_000_000  # the rank's clock runs 5 s ahead of ours

    def clock() -> int:
        return time.monotonic_ns() + skew

    with Collector() as collector:
        with Sender(collector.connect_string, 3, clock=clock) as sender:
            assert collector.wait(lambda s: s.clock.get(3, (0, -1))[1] >= 0, timeout=20)
            sender(ev.ForwardStarted(3, 0, clock(), 0))
        offset, error = collector.stats.clock[3]
        # t2 lies between t1 and t4, so the truth (-skew) is within error of the estimate.
        assert abs(offset + skew) <= error
        assert 0 <= error < 1_000_000_000


def test_same_kernel_ranks_get_the_exact_zero_offset():
    with Collector() as collector:
        with Sender(collector.connect_string, 0) as sender:
            sender(ev.ForwardStarted(0, 0, time.monotonic_ns(), 0))
        assert collector.wait(lambda s: 0 in s.closed, timeout=10)
        assert collector.stats.clock[0] == (0, 0)


def test_subscribers_iterators_and_failing_callbacks():
    with Collector() as collector:
        seen: list[ev.Event] = []
        batches: list[int] = []
        unsubscribe = collector.subscribe(seen.append)
        collector.subscribe(lambda b: batches.append(len(b)), batch=True)

        def broken(_: object) -> None:
            raise RuntimeError("boom")

        collector.subscribe(broken)
        from_thread: list[ev.Event] = []
        started = threading.Event()

        def consume() -> None:
            it = collector.events(timeout=5)
            started.set()
            for e in it:
                from_thread.append(e)
                if len(from_thread) == 300:
                    return

        worker = threading.Thread(target=consume)
        worker.start()
        started.wait(5)
        with pytest.warns(UserWarning, match="subscriber"), \
                Sender(collector.connect_string, 0, batch=64) as sender:
            tap = ev.Tap(sender, 0)
            for i in range(200):
                tap.emit(ev.GradReady, i, 0)
            sender.flush()
            assert collector.wait(lambda s: s.total_received == 200, timeout=10)
            unsubscribe()
            for i in range(100):
                tap.emit(ev.GradReady, i, 0)
        assert collector.wait(lambda s: 0 in s.closed, timeout=10)
        worker.join(10)
        assert [e.seq for e in seen] == list(range(200))
        assert sum(batches) == 300
        assert [e.seq for e in from_thread] == list(range(300))
        assert collector.stats.callback_errors == 300  # once per event, never fatal


def test_events_iterator_ends_when_the_collector_closes():
    collector = Collector()
    it = collector.events()
    done = threading.Event()
    out: list[ev.Event] = []

    def consume() -> None:
        out.extend(it)
        done.set()

    threading.Thread(target=consume, daemon=True).start()
    collector.close()
    assert done.wait(5) and out == []


def test_header_out_of_bounds_is_a_counted_schema_reject():
    with Collector() as collector:
        codec = Codec(collector.secret.encode())
        enc = msgspec.msgpack.Encoder()
        sock = _dealer(collector.address, collector.secret)
        for field, value in (("rank", 10**10), ("rank", -3), ("seq", -1), ("pid", -1)):
            fields = msgspec.to_builtins(make_header("hello", 0, "bounds", 0))
            fields[field] = value
            head, body = enc.encode(fields), enc.encode([])
            sock.send_multipart([MAGIC, codec.sign(head, body), head, body])
        assert collector.wait(lambda s: s.total_rejected >= 4, timeout=30)
        stats = collector.stats
        assert stats.rejected["schema"] == 4 and stats.total_rejected == 4
        assert stats.received == {} and stats.total_received == 0
        sock.close()
