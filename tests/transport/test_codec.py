"""The wire codec alone: round trips, every rejection reason, and no crash on any bytes."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddpviz import events as ev
from ddpviz import limits
from ddpviz.transport.codec import (
    MAGIC,
    REASONS,
    WIRE_VERSION,
    Codec,
    WireError,
    make_header,
    parse_connect_string,
)

SECRET = b"0123456789abcdef0123456789abcdef"


def _events(rank: int = 0, n: int = 5) -> list[ev.Event]:
    out: list[ev.Event] = [ev.GradReady(rank, 1, 100 + i, i, i, 0) for i in range(n)]
    out.append(ev.AllReduceLaunched(rank, 1, 200, n, 0, 4096, "float32"))
    return out


def _message(codec: Codec, events: list[ev.Event], rank: int = 0) -> list[bytes]:
    return codec.encode(make_header("events", rank, "s", 0, count=len(events)), events)


def _reason(codec: Codec, parts: list[bytes]) -> str:
    with pytest.raises(WireError) as info:
        codec.decode(parts)
    return info.value.reason


def test_round_trip_keeps_every_event_and_header_field():
    codec = Codec(SECRET)
    events = _events(rank=3)
    frame = codec.decode(_message(codec, events, rank=3))
    assert frame.events == events
    assert frame.header.kind == "events" and frame.header.rank == 3 and frame.header.count == 6
    assert [type(e) for e in frame.events] == [ev.GradReady] * 5 + [ev.AllReduceLaunched]


def test_nested_structs_survive():
    codec = Codec(SECRET)
    mismatch = ev.Mismatch("param", 2, "fc.weight", "shape", (("(5, 16)", (0,)),
                                                             ("(16, 5)", (1,))))
    events: list[ev.Event] = [ev.VerificationFailed(0, -1, 5, 0, 2, (mismatch,))]
    assert codec.decode(_message(codec, events)).events == events


def test_each_reason_is_reported():
    codec = Codec(SECRET)
    good = _message(codec, _events())
    enc = msgspec.msgpack.Encoder()

    def signed(head: bytes, body: bytes) -> list[bytes]:
        return [MAGIC, codec.sign(head, body), head, body]

    head, body = good[2], good[3]
    assert _reason(codec, [b"\x00random"]) == "garbage"
    assert _reason(codec, [*good, b"extra"]) == "garbage"
    assert _reason(codec, good[:3]) == "truncated"
    assert _reason(codec, signed(head, body[:-3])) == "truncated"
    assert _reason(codec, signed(head, b"\xc1" + body)) == "garbage"
    assert _reason(codec, [MAGIC, b"0" * 64, head, body]) == "auth"
    assert _reason(codec, Codec(b"another secret 0123456789")
                   .encode(make_header("ping", 0, "s", 0))) == "auth"
    big = Codec(SECRET, max_bytes=1000)
    assert _reason(big, _message(codec, _events(n=100))) == "oversized"
    wrong_version = enc.encode({"version": 99, "schema": ev.SCHEMA_VERSION, "kind": "ping"})
    assert _reason(codec, signed(wrong_version, enc.encode([]))) == "version"
    wrong_schema = enc.encode({"version": 1, "schema": ev.SCHEMA_VERSION + 1})
    assert _reason(codec, signed(wrong_schema, enc.encode([]))) == "version"
    missing = enc.encode({"version": WIRE_VERSION, "schema": ev.SCHEMA_VERSION,
                          "kind": "events"})
    assert _reason(codec, signed(missing, body)) == "schema"
    bad_event = enc.encode([{"type": "GradReady", "rank": 0}])
    assert _reason(codec, signed(head, bad_event)) == "schema"
    unknown = enc.encode([{"type": "NoSuchEvent", "rank": 0, "step": 0, "t_ns": 0, "seq": 0}])
    assert _reason(codec, signed(head, unknown)) == "schema"
    other_rank = _message(codec, _events(rank=1), rank=0)
    assert _reason(codec, other_rank) == "schema"
    miscounted = codec.encode(make_header("events", 0, "s", 0, count=2), _events())
    assert _reason(codec, miscounted) == "schema"
    control_with_events = codec.encode(make_header("ping", 0, "s", 0), _events())
    assert _reason(codec, control_with_events) == "schema"


@settings(max_examples=400, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=6), st.booleans())
def test_any_bytes_decode_or_raise_wire_error(parts, sign):
    codec = Codec(SECRET, max_bytes=500)
    if sign and len(parts) >= 2:
        parts = [MAGIC, codec.sign(parts[0], parts[1]), parts[0], parts[1]]
    try:
        frame = codec.decode(parts)
    except WireError as e:
        assert e.reason in REASONS
    else:
        assert frame.header.version == 1


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_signed_mutations_never_crash(data):
    codec = Codec(SECRET)
    head, body = _message(codec, _events())[2:]
    which = data.draw(st.sampled_from(["head", "body"]))
    blob = bytearray(head if which == "head" else body)
    for _ in range(data.draw(st.integers(1, 4))):
        blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(blob)))
    blob = blob[:cut]
    new_head, new_body = (bytes(blob), body) if which == "head" else (head, bytes(blob))
    try:
        codec.decode([MAGIC, codec.sign(new_head, new_body), new_head, new_body])
    except WireError as e:
        assert e.reason in REASONS and e.reason not in ("auth", "oversized")


def test_connect_string_parsing_and_error():
    assert parse_connect_string("tcp://127.0.0.1:5555#" + "ab" * 16) == (
        "tcp://127.0.0.1:5555", b"ab" * 16)
    with pytest.raises(ValueError, match="DDPVIZ_CONNECT"):
        parse_connect_string("127.0.0.1:5555")


@pytest.mark.parametrize(("field", "value"), [
    ("rank", -1), ("rank", limits.MAX_WORLD_SIZE), ("rank", 2**63 - 1),
    ("seq", -1), ("seq", limits.MAX_COUNT + 1), ("count", -5), ("dropped", -1),
    ("pid", -1), ("pid", 1 << 40),
    ("sender", "s" * (limits.MAX_NAME + 1)), ("host", "h" * (limits.MAX_NAME + 1)),
    ("boot", "b" * (limits.MAX_NAME + 1)),
])
def test_header_fields_out_of_bounds_are_a_schema_reject_naming_the_field(field, value):
    codec = Codec(SECRET)
    enc = msgspec.msgpack.Encoder()
    fields = msgspec.to_builtins(make_header("ping", 0, "s", 0))
    head = enc.encode(fields)
    body = enc.encode([])
    assert codec.decode([MAGIC, codec.sign(head, body), head, body]).header.rank == 0
    fields[field] = value  # a crafted frame, signed with the secret: only the bound refuses it
    head = enc.encode(fields)
    with pytest.raises(WireError) as info:
        codec.decode([MAGIC, codec.sign(head, body), head, body])
    assert info.value.reason == "schema"
    assert f"$.{field}" in str(info.value)


def test_header_fields_at_their_bounds_are_accepted():
    codec = Codec(SECRET)
    header = make_header("hello", limits.MAX_WORLD_SIZE - 1, "s" * limits.MAX_NAME,
                         limits.MAX_COUNT, host="h" * limits.MAX_NAME, pid=(1 << 32) - 1,
                         boot="b" * limits.MAX_NAME)
    assert codec.decode(codec.encode(header)).header == header
