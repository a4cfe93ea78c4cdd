"""The debugger's control path: the collector sends signed "control" messages to a rank over the
connection the rank's Sender opened; only this session's collector can, never twice the same,
and a bounded, well-formed body only."""

from __future__ import annotations

import queue

import msgspec
import pytest
import zmq

from ddpviz import events as ev
from ddpviz.debugger.protocol import (
    MAX_COMMANDS,
    BreakAt,
    Inspect,
    Pause,
    Resume,
    SetBreaks,
)
from ddpviz.transport.codec import MAGIC, Codec, WireError, make_header
from ddpviz.transport.collector import Collector
from ddpviz.transport.handshake import secure_client
from ddpviz.transport.sender import _EARLY_CONTROL, Sender
from tests.polling import eventually


def _connected(collector: Collector, sender: Sender, rank: int) -> None:
    ev.Tap(sender, rank).emit(ev.ForwardStarted)
    assert sender.flush(10)
    assert collector.wait(lambda s: rank in s.received, timeout=10)


def test_control_round_trip_to_one_rank_and_to_every_rank():
    with Collector() as collector:
        got: dict[int, queue.SimpleQueue[tuple[object, ...]]] = {}
        senders = []
        for rank in (0, 1):
            sender = Sender(collector.connect_string, rank)
            got[rank] = queue.SimpleQueue()
            sender.on_control(got[rank].put)
            senders.append(sender)
            _connected(collector, sender, rank)
        commands = [SetBreaks(1, (BreakAt(3, "bucket", 1),)), Inspect(2, "fc.weight", "grad")]
        assert collector.send_control(1, commands) == (1,)
        assert got[1].get(timeout=10) == tuple(commands)
        assert collector.send_control(None, [Pause(3)]) == (0, 1)
        assert got[0].get(timeout=10) == (Pause(3),)
        assert got[1].get(timeout=10) == (Pause(3),)
        assert got[0].empty() and got[1].empty()
        with pytest.raises(ValueError, match="rank 7 has not connected"):
            collector.send_control(7, [Resume(4)])
        with pytest.raises(ValueError, match=f"1 to {MAX_COMMANDS} commands"):
            collector.send_control(0, [Resume(5)] * (MAX_COMMANDS + 1))
        for sender in senders:
            sender.close()


def test_a_control_message_is_handed_on_once_and_only_to_its_rank():
    with Collector() as collector:
        sender = Sender(collector.connect_string, 0)
        got: queue.SimpleQueue[tuple[object, ...]] = queue.SimpleQueue()
        sender.on_control(got.put)
        _connected(collector, sender, 0)
        sink = sender._sink
        sink._control("c", 5, 0, (Pause(10),))  # type: ignore[attr-defined]
        sink._control("c", 5, 0, (Pause(10),))  # type: ignore[attr-defined]  # a replay
        sink._control("c", 4, 0, (Pause(11),))  # type: ignore[attr-defined]  # older
        sink._control("c", 6, 1, (Pause(12),))  # type: ignore[attr-defined]  # not this rank
        sink._control("c", 6, 0, (Resume(13),))  # type: ignore[attr-defined]
        assert got.get(timeout=5) == (Pause(10),)
        assert got.get(timeout=5) == (Resume(13),)
        assert got.empty()
        sender.close()


def test_commands_sent_before_the_debugger_is_installed_reach_it():
    """A rank connects, then installs its debugger (launch(debug=True), `ddpviz record
    --debug`); a notebook that sends a break as soon as the rank connected must not lose it in
    between. A few are kept; beyond _EARLY_CONTROL they are dropped, not piled up."""
    with Collector() as collector:
        sender = Sender(collector.connect_string, 0)
        _connected(collector, sender, 0)
        early = [Pause(20 + i) for i in range(_EARLY_CONTROL + 3)]
        for c in early:
            assert collector.send_control(0, [c]) == (0,)
        sink = sender._sink
        assert eventually(lambda: len(sink._early) == _EARLY_CONTROL,  # type: ignore[attr-defined]
                          limit=10)
        got: queue.SimpleQueue[tuple[object, ...]] = queue.SimpleQueue()
        sender.on_control(got.put)
        for c in early[:_EARLY_CONTROL]:
            assert got.get(timeout=10) == (c,)
        assert collector.send_control(0, [Resume(99)]) == (0,)
        assert got.get(timeout=10) == (Resume(99),)  # the rest dropped: never handed on
        assert got.empty()
        sender.close()


def test_a_peer_cannot_send_control_through_the_collector():
    """Without the secret it fails the handshake; with a stolen CURVE key but the wrong HMAC it
    fails the signature; even signed, a control message has no standing coming from a rank's
    side. Every one is counted under "auth"."""
    with Collector() as collector:
        ctx = zmq.Context.instance()
        wrong = b"ab" * 32
        head = Codec(wrong).encode(make_header("control", 0, "x", 0, count=1), [Pause(1)])
        bad = ctx.socket(zmq.DEALER)
        bad.setsockopt(zmq.LINGER, 0)
        secure_client(bad, wrong)
        bad.connect(collector.address)
        bad.send_multipart(head)
        assert eventually(lambda: collector.stats.handshakes_failed >= 1, 30)
        signed_wrong = ctx.socket(zmq.DEALER)
        signed_wrong.setsockopt(zmq.LINGER, 0)
        secure_client(signed_wrong, collector.secret.encode())
        signed_wrong.connect(collector.address)
        signed_wrong.send_multipart(head)
        assert eventually(lambda: collector.stats.rejected["auth"] >= 2, 30)
        right = Codec(collector.secret.encode())
        signed_wrong.send_multipart(right.encode(make_header("control", 0, "y", 0, count=1),
                                                 [Pause(1)]))
        assert eventually(lambda: collector.stats.rejected["auth"] >= 3, 30)
        assert collector.stats.received == {}
        bad.close(0)
        signed_wrong.close(0)


@pytest.mark.parametrize(("body", "count", "reason"), [
    (msgspec.msgpack.encode([{"type": "Pause", "request": 1}] * (MAX_COMMANDS + 1)),
     MAX_COMMANDS + 1, "schema"),  # too many
    (msgspec.msgpack.encode([{"type": "Explode", "request": 1}]), 1, "schema"),  # unknown
    (msgspec.msgpack.encode([{"type": "Pause", "request": -1}]), 1, "schema"),  # out of range
    (msgspec.msgpack.encode([{"type": "RunCode", "request": 1, "code": "x" * 70000}]), 1,
     "schema"),  # code over MAX_TEXT
    (msgspec.msgpack.encode([{"type": "Pause", "request": 1}]), 2, "schema"),  # count differs
    (b"\xc1\xc1\xc1", 1, "garbage"),
    (msgspec.msgpack.encode([{"type": "Pause", "request": 1}])[:-3], 1, "truncated"),
    (b"\x90" + b"x" * (5 << 20), 0, "oversized"),
])
def test_a_bad_control_body_is_refused_with_its_reason(body: bytes, count: int, reason: str):
    codec = Codec(b"s" * 32)
    parts = codec.encode_with_body(make_header("control", 0, "c", 0, count=count), body)
    assert parts[0] == MAGIC
    with pytest.raises(WireError) as err:
        codec.decode(parts)
    assert err.value.reason == reason
    # the same body signed with another secret: refused before it is read
    with pytest.raises(WireError) as err:
        Codec(b"t" * 32).decode(parts)
    assert err.value.reason in ("auth", "oversized")
