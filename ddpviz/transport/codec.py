"""The wire encoding of ddpviz's event stream: the only module that knows it.

A message is four zmq frames, signed like Jupyter's messages (HMAC-SHA256 over the serialized
parts, hex digest in its own frame): `[MAGIC, signature, header, body]`. The header is a msgpack
map (`Header`); the body is a msgpack array of tagged events (`ddpviz.events`), or for kind
"control" (collector -> rank, the debugger) of tagged commands (`ddpviz.debugger.protocol`).
`Codec.decode` never raises anything but `WireError`, whose `reason` is one of `REASONS`. Checks
run in a fixed order, so every rejected message is counted under exactly one reason:

1. garbage    first frame is not MAGIC, or more than four frames
2. truncated  MAGIC but fewer than four frames (also: a signed header or body cut short)
3. oversized  more than `max_bytes` in all (checked before hashing anything)
4. auth       signature missing or wrong: the peer does not hold the session secret (the
              collector also counts here failed zmq handshakes, replayed messages, and a bye
              for a rank its sender never spoke for)
5. truncated / garbage: signed header or body is cut short / malformed (or invalid UTF-8)
6. version    header's wire `version` or event `schema` differs from ours
7. schema     valid msgpack of the wrong shape (header fields, event fields, counts, ranks)
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from typing import Annotated, Any, Literal, NamedTuple, cast

import msgspec

from ddpviz import limits
from ddpviz.debugger.protocol import ANY_COMMAND, MAX_COMMANDS, Command
from ddpviz.events import ANY_EVENT, SCHEMA_VERSION, Event

WIRE_VERSION = 2
MAGIC = b"ddpviz"
MAX_MESSAGE_BYTES = 4 << 20  # senders split larger batches (ParamsBuilt of 40k params fits)
MAX_FRAME_SLACK = 128 << 10  # zmq's per-frame limit is max_bytes + this (see Collector)
REASONS = ("garbage", "truncated", "oversized", "version", "schema", "auth")
Reason = Literal["garbage", "truncated", "oversized", "version", "schema", "auth"]
Kind = Literal["hello", "ping", "pong", "clock", "events", "bye", "ack", "control"]


class WireError(ValueError):
    """A message the codec refused; `reason` says which check failed (see REASONS)."""

    def __init__(self, reason: Reason, detail: str) -> None:
        self.reason = reason
        super().__init__(f"ddpviz: rejected a message ({reason}): {detail}")


class Header(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Everything about a message except its events. Control kinds carry no events."""

    version: int  # WIRE_VERSION of the sender
    schema: int  # events.SCHEMA_VERSION of the sender
    kind: Kind
    rank: limits.Rank  # bounds (ddpviz.limits) are checked on decode: a "schema" reject
    sender: limits.Name  # random id of one Sender instance; a restarted rank gets a new one
    seq: limits.Count  # frame number from this sender, from 0, every kind counted
    count: limits.Count = 0  # events/control: len(body); bye: events shipped in total
    dropped: limits.Count = 0  # bye: events dropped by this sender in total
    t_ns: int = 0  # hello/ping: sender's monotonic clock at send; pong: echoed back
    wall_ns: int = 0  # hello: sender's wall clock (time.time_ns) at send
    peer_ns: int = 0  # pong: collector's monotonic clock when the ping arrived
    offset_ns: int = 0  # clock: estimated collector clock minus sender clock
    error_ns: int = 0  # clock: bound on the estimate's error (half the round trip)
    host: limits.Name = ""  # hello: sender's hostname
    pid: limits.Pid = 0  # hello: sender's process id
    boot: limits.Name = ""  # hello: kernel boot id: equal boot ids share one monotonic clock
    batch: limits.Count = 0  # events/bye: the sender's batch number; ack: the last of the
    #                          sender's batches that all arrived (collector.py: See [Note: one
    #                          stream per sender])


class _Versions(msgspec.Struct):
    """Just enough of a header to check versions before trusting the rest of it."""

    version: int
    schema: int


class Frame(NamedTuple):
    header: Header
    events: list[Event]  # empty for every kind but "events"
    commands: tuple[Command, ...] = ()  # the debugger's commands of a "control" message


class Codec:
    """Encodes and validates messages for one session secret. One per thread (not shared).

    Args:
        secret: the session secret; its bytes are the HMAC key (as in Jupyter's `key`).
        max_bytes: messages larger than this are rejected as "oversized" before hashing.
    """

    def __init__(self, secret: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> None:
        if not secret:
            raise ValueError("ddpviz: the session secret is empty; messages would be unsigned. "
                             "Pass the secret from the connect string.")
        self._mac = hmac.new(secret, digestmod=hashlib.sha256)
        self.max_bytes = max_bytes
        self._encoder = msgspec.msgpack.Encoder()
        self._versions = msgspec.msgpack.Decoder(_Versions)
        self._header = msgspec.msgpack.Decoder(Header)
        self._events = msgspec.msgpack.Decoder(list[ANY_EVENT])
        self._commands = msgspec.msgpack.Decoder(
            Annotated[list[ANY_COMMAND], msgspec.Meta(max_length=MAX_COMMANDS)])

    def sign(self, header: bytes, body: bytes) -> bytes:
        mac = self._mac.copy()
        mac.update(header)
        mac.update(body)
        return mac.hexdigest().encode()

    def encode(self, header: Header, events: list[Any] | tuple[()] = ()) -> list[bytes]:
        """The frames of one message: [MAGIC, signature, header, body] (body: events, or a
        control message's commands)."""
        head = self._encoder.encode(header)
        body = self._encoder.encode(events)
        return [MAGIC, self.sign(head, body), head, body]

    def encode_body(self, events: list[Event]) -> bytes:
        """Events as a body, so a sender can check the size before building the message."""
        return self._encoder.encode(events)

    def encode_with_body(self, header: Header, body: bytes) -> list[bytes]:
        head = self._encoder.encode(header)
        return [MAGIC, self.sign(head, body), head, body]

    def decode(self, parts: list[bytes]) -> Frame:
        """Validate and decode one message; raises WireError (only) when it is refused."""
        if not parts or parts[0] != MAGIC:
            raise WireError("garbage", "not a ddpviz message (first frame is not the magic)")
        if len(parts) > 4:
            raise WireError("garbage", f"{len(parts)} frames, expected 4")
        if len(parts) < 4:
            raise WireError("truncated", f"{len(parts)} frames, expected 4")
        size = sum(len(p) for p in parts)
        if size > self.max_bytes:
            raise WireError("oversized", f"{size} bytes > limit {self.max_bytes}")
        _, signature, head, body = parts
        if not hmac.compare_digest(signature, self.sign(head, body)):
            raise WireError("auth", "bad signature (the sender lacks this session's secret)")
        try:  # ValidationError subclasses DecodeError: catch it first
            versions = self._versions.decode(head)
        except msgspec.ValidationError as err:
            raise WireError("schema", f"header: {err}") from None
        except msgspec.DecodeError as err:
            raise _malformed("header", err) from None
        except ValueError as err:  # e.g. UnicodeDecodeError: invalid UTF-8 in a string
            raise WireError("garbage", f"header: {err}") from None
        if versions.version != WIRE_VERSION or versions.schema != SCHEMA_VERSION:
            raise WireError("version", f"wire {versions.version}, schema {versions.schema}; "
                            f"expected wire {WIRE_VERSION}, schema {SCHEMA_VERSION}")
        try:
            header = self._header.decode(head)
        except msgspec.ValidationError as err:
            raise WireError("schema", f"header: {err}") from None
        except ValueError as err:
            raise WireError("garbage", f"header: {err}") from None
        if header.kind == "control":
            return Frame(header, [], tuple(self._decode_commands(header, body)))
        events = cast("list[Event]", _body(self._events, body, "events"))
        try:
            limits.check_events(events)
        except limits.LimitError as err:
            raise WireError("schema", str(err)) from None
        if header.kind == "events":
            if header.count != len(events):
                raise WireError("schema", f"header says {header.count} events, body has "
                                f"{len(events)}")
            rank = header.rank
            for event in events:
                if event.rank != rank:
                    raise WireError("schema", f"event of rank {event.rank} in a frame from "
                                    f"rank {rank}")
        elif events:
            raise WireError("schema", f"a {header.kind!r} message carries {len(events)} events")
        return Frame(header, events)

    def _decode_commands(self, header: Header, body: bytes) -> list[Command]:
        commands = cast("list[Command]", _body(self._commands, body, "commands"))
        if header.count != len(commands):
            raise WireError("schema", f"header says {header.count} commands, body has "
                            f"{len(commands)}")
        return commands


def _body(decoder: msgspec.msgpack.Decoder[Any], body: bytes, what: str) -> object:
    """A message body decoded (events or commands), its failure as the WireError it counts as."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as err:
        raise WireError("schema", f"{what}: {err}") from None
    except msgspec.DecodeError as err:
        raise _malformed("body", err) from None
    except ValueError as err:
        raise WireError("garbage", f"{what}: {err}") from None


def _malformed(where: str, error: msgspec.DecodeError) -> WireError:
    if "truncated" in str(error):
        return WireError("truncated", f"{where}: {error}")
    return WireError("garbage", f"{where}: {error}")


@functools.cache
def boot_id() -> str:
    """This kernel's boot id (Linux), or "" where unknown. Processes with the same boot id
    read the same CLOCK_MONOTONIC, so their clocks need no alignment."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def make_header(kind: Kind, rank: int, sender: str, seq: int, **fields: int | str) -> Header:
    """A header for this process's wire and schema versions."""
    return Header(WIRE_VERSION, SCHEMA_VERSION, kind, rank, sender, seq, **fields)  # type: ignore[arg-type]


def parse_connect_string(connect: str) -> tuple[str, bytes]:
    """Split "tcp://host:port#secret" into the zmq address and the secret's bytes."""
    address, sep, secret = connect.strip().rpartition("#")
    if not sep or not address.startswith(("tcp://", "ipc://")) or len(secret) < 16:
        # Never echo what may be (part of) a secret: error texts end up in saved outputs.
        shown = (f"{address[:60]!r} + '#' + {len(secret)} characters" if sep else
                 f"{len(connect)} characters without '#'")
        raise ValueError(f"ddpviz: the connect string ({shown}) is not "
                         "'tcp://HOST:PORT#SECRET' with a secret of 16+ characters.\n"
                         "Set DDPVIZ_CONNECT from the file `ddpviz.listen()` names "
                         "(DDPVIZ_CONNECT=\"$(cat PATH)\") or from `session.connect_string`.")
    return address, secret.encode()
