"""The `.ddpviz` file format and its incremental writer, shared by traces and rank-side senders.

A `.ddpviz` file is data only (msgpack through msgspec's typed decoders, never pickle): the
8-byte magic, then frames `kind (u8) | length (u32 LE) | crc32 (u32 LE) | payload`. The first
frame is the header (format and event-schema versions, metadata); then event chunks and clock
records in any order. `TraceWriter` appends and flushes frame by frame, so a writer that dies
mid-run leaves every flushed frame loadable. Reading (and the `Trace` container) is trace.py's;
this module imports only the vocabulary, so `transport/` can write files without it.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from ddpviz import limits
from ddpviz.events import SCHEMA_VERSION, Event

FORMAT_VERSION = 1
SUFFIX = ".ddpviz"
MAGIC = b"DDPVIZ\x00\x1a"  # \x1a stops `type`/`cat` on Windows; \x00 marks it binary
FRAME = struct.Struct("<BII")
HEADER, EVENTS, CLOCK, END = 1, 2, 3, 4

# [Note: a rank's end in its file]
# A rank's sender (transport/sender.py, `Sender.to_file`) closing its file at the end of the run
# appends one END frame after the last events: the file is whole and the rank is done. A reader
# on another node cannot ask whether the writing process still runs (follow.py does that only
# on its own machine), so the file has to say it. It is a frame kind, not an event, because
# every reader since format 1 skips frame kinds it does not know (trace.py, follow.py): files
# with it still load in older ddpviz versions, while a new event type would be an unknown tag
# inside an EVENTS frame, failing the whole frame for them (a SCHEMA_VERSION change). It is
# also a fact about the file (its writer closed it), not about DDP. A rank killed, crashed
# hard or hung never writes it; one whose script died of an uncaught exception does (the
# interpreter still runs its exit hooks) and says so in `error`. It is always the last frame,
# so `read_end` finds it from the file's tail without reading the rest.


class TraceError(ValueError):
    """A file that is not a loadable ddpviz trace. `partial`, when set, is the trace read up to
    where reading stopped (the events of every intact frame before it), for the caller to use
    knowingly: `except TraceError as e: trace = e.partial`."""

    def __init__(self, message: str, partial: Any = None) -> None:
        super().__init__(message)
        self.partial = partial


# [Note: a frame past the end]
# A frame whose length runs past the end of the file is either the torn tail a writer that
# died mid-frame leaves (loaded up to it, with a warning) or a length that lies, mid-file.
# The format has no sync marker, so the frames after a lying length cannot be found soundly: a
# scan would try every byte offset, take any byte run whose CRC happens to match, and costs
# quadratic time on a hostile file. So it is not resynchronised; a claimed length above any
# frame a writer produces (events are small; a chunk of 8,192 is a few MB) is not taken for a
# torn tail: it raises TraceError saying how many events were read and where reading stopped,
# with those events in `.partial`, so that dropping the rest of the file is the user's choice.
MAX_TORN_FRAME = 1 << 30


def check_past_end(path: Path, where: int, length: int, remaining: int, partial: Any) -> None:
    """A frame at byte `where` claims `length` bytes of payload and `remaining` are left: return
    if it may be a torn tail, else raise TraceError (See [Note: a frame past the end])."""
    if length <= MAX_TORN_FRAME:
        return
    raise TraceError(
        f"ddpviz: {str(path)!r}: the frame at byte {where:,} claims {length:,} bytes, more than "
        f"any ddpviz frame and more than the {remaining:,} left in the file: the file is "
        f"damaged or hostile past that point. {len(partial):,} events were read before it."
        "\nTo use them, catch the error and take its `.partial` trace (`except TraceError as "
        "e: trace = e.partial`); the rest of the file cannot be read.", partial)


class FileHeader(msgspec.Struct):
    """The first frame: versions and the run's metadata (plain data)."""

    format: int
    schema: int
    meta: dict[str, Any] = {}


class Format(msgspec.Struct):
    """The header read for its format version only, before the rest is trusted."""

    format: int


class Clock(msgspec.Struct, array_like=True):
    """A rank's clock offset record (see Trace.aligned_ns); the latest record wins."""

    rank: limits.Rank
    offset_ns: limits.TimeNs  # add to the rank's t_ns to get the reference (collector's) clock
    error_ns: limits.TimeNs  # bound on the offset's error; -1 when unknown


class End(msgspec.Struct, array_like=True):
    """The last frame of a rank's file whose writer closed cleanly (See [Note: a rank's end in
    its file])."""

    rank: limits.Rank
    events: limits.Count  # events the writer put in the file (EventsDropped markers included)
    dropped: limits.Count  # events the rank dropped (its sender's buffer was full)
    error: limits.Name = ""  # the uncaught exception's type the process exited with ("" none)


_END_MAX = 128  # bytes of an End frame's payload at most (writers clip `error` to END_ERROR)
END_ERROR = 64
decode_end = msgspec.msgpack.Decoder(End).decode


def read_end(path: str | os.PathLike[str]) -> End | None:
    """A rank's file's end record, read from its last bytes alone: None when the file does not
    end with one (its writer still runs, or died; or the file is not a rank's own)."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        start = max(len(MAGIC), size - FRAME.size - _END_MAX)
        f.seek(start)
        tail = f.read(size - start)
    for length in range(1, _END_MAX + 1):  # the frame ends exactly at the end of the file
        at = len(tail) - FRAME.size - length
        if at < 0:
            break
        kind, claimed, crc = FRAME.unpack_from(tail, at)
        if kind == END and claimed == length and zlib.crc32(tail[at + FRAME.size:]) == crc:
            try:
                return decode_end(tail[at + FRAME.size:])
            except (msgspec.MsgspecError, ValueError):
                return None
    return None


class TraceWriter:
    """Appends events to a `.ddpviz` file as they come; crash-safe at every `flush()`.
    (It writes in place: `Trace.save` and recording sessions point it at a temporary file and
    rename that into place, see ddpviz/atomic.py.)

    Args:
        path: file to create (overwritten if it exists).
        meta: plain data (str/int/float/bool/None, lists, dicts) stored in the header.
        chunk: events per frame; a full chunk is written (not fsynced) immediately.
    Also an emitter: `writer(event)`. Not thread-safe: one writing thread.
    """

    def __init__(self, path: str | os.PathLike[str], *, meta: dict[str, Any] | None = None,
                 chunk: int = 4096) -> None:
        self.path = Path(path)
        self._encoder = msgspec.msgpack.Encoder()
        self._pending: list[Event] = []
        self._chunk = chunk
        self.count = 0  # events written to the OS so far
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        self._file.write(MAGIC)
        self._frame(HEADER, FileHeader(FORMAT_VERSION, SCHEMA_VERSION, dict(meta or {})))
        self._file.flush()

    def _frame(self, kind: int, obj: object) -> None:
        payload = self._encoder.encode(obj)
        self._file.write(FRAME.pack(kind, len(payload), zlib.crc32(payload)))
        self._file.write(payload)

    def __call__(self, event: Event, /) -> None:
        self._pending.append(event)
        if len(self._pending) >= self._chunk:
            self.flush()

    def write(self, event: Event) -> None:
        self(event)

    def write_many(self, events: Iterable[Event]) -> None:
        self._pending.extend(events)
        if len(self._pending) >= self._chunk:
            self.flush()

    def write_clock(self, rank: int, offset_ns: int, error_ns: int) -> None:
        """Record a rank's clock offset (see Trace.aligned_ns); the latest record wins."""
        self._frame(CLOCK, Clock(rank, offset_ns, error_ns))

    def write_end(self, end: End) -> None:
        """Write the pending events, then the end record: the file is complete (call `close`
        next; See [Note: a rank's end in its file])."""
        self.flush()
        if len(end.error) > END_ERROR:  # bounded: read_end reads the tail only
            end = msgspec.structs.replace(end, error=end.error[:END_ERROR])
        self._frame(END, end)
        self._file.flush()

    def flush(self, fsync: bool = False) -> None:
        """Write pending events as one frame and hand the file's buffer to the OS (which keeps
        it if this process dies); `fsync=True` also survives a power cut."""
        if self._file.closed:
            return
        pending, self._pending = self._pending, []
        for i in range(0, len(pending), self._chunk):
            self._frame(EVENTS, pending[i:i + self._chunk])
        self.count += len(pending)
        self._file.flush()
        if fsync:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self.flush()
            self._file.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
