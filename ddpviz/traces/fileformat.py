"""The `.ddpviz` file format and its incremental writer, shared by traces and rank-side senders.

A `.ddpviz` file is data only (msgpack through msgspec's typed decoders, never pickle): the
8-byte magic, then frames `kind (u8) | length (u32 LE) | crc32 (u32 LE) | payload`. The first
frame is the header (format and event-schema versions, metadata); then event chunks and clock
records in any order (and, in the bytes a view sends, COPY frames: See [Note: the COPY
frame]). `TraceWriter` appends and flushes frame by frame, so a writer that dies mid-run leaves
every flushed frame loadable; `read_trace` walks the frames of a file (the
`Trace` container, trace.py, is built from what it yields), keeps the complete frames before a
torn last one with a warning, and raises TraceError on anything else; `TailReader` reads a file
a running job still appends to (`listen(follow=DIR)`), whole frames only, from where it stopped.
This module imports only the vocabulary, so `transport/` can write files without the rest of
ddpviz.
"""

from __future__ import annotations

import itertools
import os
import re
import struct
import unicodedata
import warnings
import zlib
from collections.abc import Callable, Generator, Hashable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, NamedTuple, NoReturn, cast

import msgspec
import numpy as np

from ddpviz import limits
from ddpviz.events import ANY_EVENT, SCHEMA_VERSION, Event
from ddpviz.traces.columnframe import (
    COLUMN_CHUNK,
    COLUMNS,
    decode_columns,
    encode_columns,
    events_of,
    is_hot,
)
from ddpviz.traces.columns import CODE, Table
from ddpviz.traces.copies import (
    COPY_SOURCES,
    MAX_COPIES,
    Copy,
    CopyFinder,
    Sources,
    decode_copies,
)
from ddpviz.traces.framecolumns import EventColumns, RareCache, decode_frames
from ddpviz.traces.tablebytes import encode_parts

FORMAT_VERSION = 3  # the newest: files that may hold wide COLUMNS frames (See columnframe.py)
READ_FORMATS = (1, 2, 3)  # 1: event frames only, what a writer without columns still writes;
# 2: COLUMNS frames of 6 widths and COPY frames
SUFFIX = ".ddpviz"
MAGIC = b"DDPVIZ\x00\x1a"  # \x1a stops `type`/`cat` on Windows; \x00 marks it binary
FRAME = struct.Struct("<BII")
HEADER, EVENTS, CLOCK, END, COPY = 1, 2, 3, 4, 5  # and COLUMNS (6): columnframe.py
MIN_COLUMN_RUN = 64  # hot rows in a row below which a columns writer writes them as events
ENCODE_ROWS = 1 << 16  # rows a TraceWriter encodes from columns at once (bounds its memory)

# [Note: the COPY frame]
# Every rank reports the same constructor payloads (a ParamsBuilt of 10,000 parameters, the bucket
# maps): written out for each of 256 ranks, they made that run, its hooks summarized for a view,
# 298 MiB, over the 64 MiB a view sends; copied, it is 42 MiB. A COPY frame's payload is a msgpack
# array of entries `[src_rank, src_seq, rank, step, t_ns, seq]` (copies.py `Copy`), each meaning:
# append to `rank`'s events, at this point of the file, the event that `src_rank` wrote with seq
# `src_seq` earlier in this file, with these four fields (the only ones an Event has of its own:
# events.py `Event`). Positional, so each rank's events stay in file order, which is its emission
# order (the TS reader and the columns rely on it); a reader decodes the event frames before a
# COPY frame first. The source is looked up by (rank, seq) among the events read so far of the
# types with list fields (copies.py COPY_SOURCES: never a hot type, so a reader keeps a dict of a
# few events per rank, O(1) per copy); a copy is itself such an event, so a copy of a copy
# resolves to the one payload, no chain is walked; a later event at the same (rank, seq) replaces
# an earlier one. A copy that names no such event, or entries beyond limits.py's bounds or
# MAX_COPIES a frame, is damage: TraceError (Python), a rejected event (TS). The copies of a file
# may repeat at most copies.MAX_COPIED list entries in all, so a file of a few bytes per copy
# cannot present what a file of more than a GB would. Readers share the payload: Python copies
# with `msgspec.structs.replace`, TS with `{...src, rank, step, t_ns, seq}`.
# Who writes it: `TraceWriter(copies=True)`, for what a view sends to the browser (view_bytes.py,
# view_summary.py) and for `Trace.save`'s files, which are format 2 or 3 (they hold COLUMNS
# frames: columnframe.py). Only in format 2 and later: a format-1 reader of an older ddpviz
# skips frame kinds it does not know, so it would read a format-1 file with COPY frames without
# the copied events, silently; it refuses a format-2 file with a message instead. A rank's
# sender never writes one (its files are format 1); `TailReader` (follow.py) still resolves
# them.

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
# interpreter still runs its exit hooks) and says so in `error`. It is always the last frame.
# `read_end` finds it by walking the frame headers from the file's start, never by reading the
# file's last bytes as a frame: those may be the end of an event's payload (a parameter name
# can spell a whole END frame, CRC included), and no frame boundary is known from the tail. A
# record counts only for its own file's rank (See [Note: whose end record counts], source.py).


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


def check_past_end(path: Path, where: int, length: int, remaining: int, events: int,
                   partial: Any) -> None:
    """A frame at byte `where` claims `length` bytes of payload and `remaining` are left, after
    `events` events were read: return if it may be a torn tail, else raise TraceError with
    `partial` (See [Note: a frame past the end])."""
    if length <= MAX_TORN_FRAME:
        return
    raise TraceError(
        f"ddpviz: {str(path)!r}: the frame at byte {where:,} claims {length:,} bytes, more than "
        f"any ddpviz frame and more than the {remaining:,} left in the file: the file is "
        f"damaged or hostile past that point. {events:,} events were read before it."
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
_WALK_BLOCK = 1 << 16  # bytes read at once by read_end's walk over the frame headers
END_ERROR = 64
decode_end = msgspec.msgpack.Decoder(End).decode


def read_end(path: str | os.PathLike[str]) -> End | None:
    """A rank's file's end record: None when the file does not end with one (its writer still
    runs, or died; or the file is not a rank's own).

    The record is taken only where it is a frame: the frame headers are walked from the first
    (See [Note: a rank's end in its file]), 9 bytes each, read a block at a time, so the cost is
    linear in the frames and a big file's payloads are mostly skipped. A frame that runs past
    the end (a torn tail), a first frame that is not a header or a last one that is not a whole
    END frame with its checksum: None."""
    with open(path, "rb", buffering=_WALK_BLOCK) as f:
        size = os.fstat(f.fileno()).st_size
        if f.read(len(MAGIC)) != MAGIC:
            return None
        pos, frames = len(MAGIC), 0
        while True:
            if size - pos < FRAME.size:
                return None  # no frame after the header, or one cut short
            f.seek(pos)  # (within the block read last: no system call)
            head = f.read(FRAME.size)
            if len(head) < FRAME.size:
                return None  # shrank under the walk
            kind, length, crc = FRAME.unpack(head)
            if frames == 0 and kind != HEADER:
                return None
            frames += 1
            after = pos + FRAME.size + length
            if after >= size:
                break
            pos = after
        if after != size or kind != END or frames < 2 or length > _END_MAX:
            return None
        payload = f.read(length)
    if len(payload) != length or zlib.crc32(payload) != crc:
        return None
    try:
        return decode_end(payload)
    except (msgspec.MsgspecError, ValueError):
        return None


# [Note: text from a file, on a terminal]
# A string read from a trace or off the wire (a name, an END's `error`, a value msgspec quotes
# in its error message) is its writer's text. Printed as is, a newline in it starts a line that
# reads as ddpviz's own ("ddpviz: healthy: no problems found."), C0/C1 controls (ANSI escapes)
# rewrite what was printed above, and format characters (Unicode category Cf: the bidi
# overrides U+202A-202E and isolates U+2066-2069, zero-width ones) reorder or hide the text
# after them. `printable` shows each of these as its escape; text for a terminal built from
# such values goes through it field by field (or line by line, for ddpviz's own multi-line
# messages), so ddpviz's lines stay its own (verdict.py, cli.py). Python's `repr`, which
# messages use for paths, escapes them too.
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]")  # printable ASCII never needs a look


def _escape(m: re.Match[str]) -> str:
    c = m.group()
    o = ord(c)
    if c == "\n":
        return "\\n"
    if o < 0x20 or 0x7f <= o <= 0x9f:
        return f"\\x{o:02x}"
    if unicodedata.category(c) in ("Cf", "Zl", "Zp"):
        return f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}"
    return c  # any other letter, mark or symbol, as is


def printable(value: object) -> str:
    """`str(value)` for a terminal, on one line and in its own order: newlines, controls and
    format characters shown as escapes (`\\n`, `\\x1b`, `\\u202e`); See [Note: text from a file,
    on a terminal]."""
    return _UNPRINTABLE.sub(_escape, str(value))


class TraceWriter:
    """Appends events to a `.ddpviz` file as they come; crash-safe at every `flush()`.
    (It writes in place: `Trace.save` and recording sessions point it at a temporary file and
    rename that into place, see ddpviz/atomic.py.)

    Args:
        path: file to create (overwritten if it exists).
        meta: plain data (str/int/float/bool/None, lists, dicts) stored in the header.
        chunk: events per frame; a full chunk is written (not fsynced) immediately.
        copies: write a big event that equals one written before but for its rank, step, t_ns
            and seq as a COPY frame (See [Note: the COPY frame]); the file is then format 2.
        columns: write the hot events of `write_tables` as COLUMNS frames (See [Note: the
            COLUMNS frame] in columnframe.py); the file is then format 2.
        summaries: with `columns`, write its GradsSummarized events in COLUMNS frames too (wide
            ones); the file is then format 3.
    Also an emitter: `writer(event)`. Not thread-safe: one writing thread.
    """

    def __init__(self, path: str | os.PathLike[str], *, meta: dict[str, Any] | None = None,
                 chunk: int = 4096, copies: bool = False, columns: bool = False,
                 summaries: bool = False) -> None:
        self.path = Path(path)
        self._encoder = msgspec.msgpack.Encoder()
        self._pending: list[Event] = []
        self._finder = CopyFinder() if copies else None
        self._copies: list[Any] = []  # copies not yet written (never with events pending)
        self._chunk = chunk
        self._columns = columns
        self._summaries = columns and summaries
        self.count = 0  # events written to the OS so far
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        self._file.write(MAGIC)
        self._frame(HEADER, FileHeader(FORMAT_VERSION if self._summaries else
                                       2 if columns or copies else 1,
                                       SCHEMA_VERSION, dict(meta or {})))
        self._file.flush()

    def _frame(self, kind: int, obj: object) -> None:
        payload = self._encoder.encode(obj)
        self._file.write(FRAME.pack(kind, len(payload), zlib.crc32(payload)))
        self._file.write(payload)

    def __call__(self, event: Event, /) -> None:
        if self._finder is not None:
            self.write_many((event,))
            return
        self._pending.append(event)
        if len(self._pending) >= self._chunk:
            self.flush()

    def write(self, event: Event) -> None:
        self(event)

    def write_many(self, events: Iterable[Event]) -> None:
        if self._finder is None:
            self._pending.extend(events)
        else:
            batch = events if isinstance(events, list) else list(events)
            sources = COPY_SOURCES
            start = 0
            for i in [i for i, e in enumerate(batch) if type(e) in sources]:
                copy = self._finder.copy_of(batch[i])
                if copy is None:
                    continue
                self._events(batch[start:i])
                if self._pending:
                    self._write_pending()
                self._copies.append(copy)
                if len(self._copies) >= MAX_COPIES:
                    self._write_copies()
                start = i + 1
            self._events(batch[start:])
        if len(self._pending) >= self._chunk:
            self.flush()

    def _events(self, events: list[Event]) -> None:
        if events:
            if self._copies:
                self._write_copies()
            self._pending.extend(events)

    def _write_copies(self) -> None:
        copies, self._copies = self._copies, []
        self._frame(COPY, copies)
        self.count += len(copies)

    def _write_pending(self) -> None:
        pending, self._pending = self._pending, []
        for i in range(0, len(pending), self._chunk):
            self._frame(EVENTS, pending[i:i + self._chunk])
        self.count += len(pending)

    def write_ranks(self, clock: Mapping[int, tuple[int, int]],
                    ranks: Iterable[Iterable[Event] | Table]) -> None:
        """A whole run as `Trace.save` lays it out: its clock records (rank -> (offset_ns,
        error_ns)), then each rank's events (or its columns: `write_table`) in turn, flushed
        rank by rank."""
        for rank, (offset, error) in sorted(clock.items()):
            self.write_clock(rank, offset, error)
        tables: list[Table] = []
        for events in ranks:
            if isinstance(events, Table):
                tables.append(events)
                continue
            self.write_tables(tables)
            tables = []
            self.write_many(events)
            self.flush()
        self.write_tables(tables)

    def write_tables(self, tables: Iterable[Table]) -> None:
        """Ranks' events from their columns, rank by rank in row order, without an object per
        event (See [Note: encoding columns as msgspec would] in tablebytes.py): after what was
        written before, the frames (and COPY frames) that `write_many(table.events())` then
        `flush()` for each table write, byte for byte. Encoded ENCODE_ROWS rows at a time."""
        self.flush()
        batch: list[_Op] = []
        rows = 0
        for op in self._ops(tables):
            batch.append(op)
            rows += len(op.rows) if op.rows is not None else 0
            if rows >= ENCODE_ROWS:
                self._write_ops(batch)
                batch, rows = [], 0
        self._write_ops(batch)
        self._file.flush()

    def _ops(self, tables: Iterable[Table]) -> Iterator[_Op]:
        """What writing these tables does, in order: rows to write as event frames (a run
        between copies, in blocks of whole frames), copies, and each rank's end."""
        block = self._chunk * max(1, ENCODE_ROWS // self._chunk)
        for table in tables:
            copies: dict[int, Copy] = {}
            if self._finder is not None:
                for row in sorted(table.objects):
                    e = table.objects[row]
                    if type(e) in COPY_SOURCES and (copy := self._finder.copy_of(e)):
                        copies[row] = copy
            keep = np.ones(len(table), dtype=bool)
            keep[list(copies)] = False
            rows = np.flatnonzero(keep)
            done = 0  # of `rows`
            for before, at in itertools.pairwise([-1, *copies, len(table)]):
                run = at - before - 1
                for start in range(done, done + run, block):
                    yield _Op(table, rows[start:min(start + block, done + run)], None)
                done += run
                if at in copies:
                    yield _Op(table, None, copies[at])
            yield _Op(table, None, None)

    def _write_ops(self, ops: list[_Op]) -> None:
        """Carry out `_ops`: each run of rows as EVENTS frames (all of the batch's encoded in
        one pass) or, for a columns writer, a long enough run of hot rows as COLUMNS frames
        (of at most COLUMN_CHUNK rows); copies as COPY frames before the next events, when
        MAX_COPIES are waiting, or at the rank's end."""
        steps: list[tuple[_Op, np.ndarray | None, bool]] = []  # (op, its run, columnar)
        for op in ops:
            if op.rows is None or not self._columns:
                steps.append((op, op.rows, False))
                continue
            hot = is_hot(op.table, self._summaries)[op.rows]
            # runs of rows alike (hot or not): where `hot` changes; a short hot run goes with
            # the rare rows around it (a frame per few rows costs more than it saves)
            cuts = [0, *(np.flatnonzero(hot[1:] != hot[:-1]) + 1).tolist(), len(op.rows)]
            merged: list[tuple[int, int, bool]] = []
            for a, b in itertools.pairwise(cuts):
                columnar = bool(hot[a]) and b - a >= MIN_COLUMN_RUN
                if merged and not columnar and not merged[-1][2]:
                    merged[-1] = (merged[-1][0], b, False)
                else:
                    merged.append((a, b, columnar))
            steps += [(op, op.rows[a:b], columnar) for a, b, columnar in merged]
        parts = [(op.table, run) for op, run, columnar in steps
                 if run is not None and not columnar]
        encoded = encode_parts(parts) if parts else None
        at = 0  # rows of `encoded` written
        for op, run, columnar in steps:
            if run is None:
                if op.copy is not None:
                    self._copies.append(op.copy)
                    if len(self._copies) < MAX_COPIES:
                        continue
                if self._copies:  # (a full COPY frame, or the rank's end)
                    self._write_copies()
                continue
            if self._copies:
                self._write_copies()
            if columnar:
                for i in range(0, len(run), COLUMN_CHUNK):
                    self._frame_bytes(COLUMNS, encode_columns(op.table, run[i:i + COLUMN_CHUNK]))
                self.count += len(run)
            else:
                assert encoded is not None
                self._write_encoded(encoded.data, encoded.offsets[at:at + len(run) + 1])
                at += len(run)

    def _frame_bytes(self, kind: int, payload: bytes) -> None:
        self._file.write(FRAME.pack(kind, len(payload), zlib.crc32(payload)))
        self._file.write(payload)

    def _write_encoded(self, data: np.ndarray, offsets: np.ndarray) -> None:
        """Encoded events (data[offsets[i]:offsets[i + 1]] each) as EVENTS frames of at most
        `chunk` events each."""
        n = len(offsets) - 1
        for i in range(0, n, self._chunk):
            j = min(i + self._chunk, n)
            head = _array_head(j - i)
            body = data[offsets[i]:offsets[j]].data
            self._file.write(FRAME.pack(EVENTS, len(head) + len(body),
                                        zlib.crc32(body, zlib.crc32(head))))
            self._file.write(head)
            self._file.write(body)
        self.count += n

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
        if self._copies:
            self._write_copies()
        self._write_pending()
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


class _Op(NamedTuple):
    """One step of writing tables (TraceWriter._ops): rows, a copy, or (neither) a rank's
    end."""

    table: Table
    rows: np.ndarray | None
    copy: Copy | None


def _array_head(n: int) -> bytes:
    """The header of a msgpack array of n items, as msgspec writes it."""
    if n < 16:
        return bytes([0x90 | n])
    return b"\xdc" + n.to_bytes(2, "big") if n < 1 << 16 else b"\xdd" + n.to_bytes(4, "big")


# --- reading ----------------------------------------------------------------------------------

WHOLE_BELOW = 64 << 20  # smaller files are read whole; bigger ones a window at a time
WINDOW = 16 << 20  # bytes of a big file read at once
DECODE_BYTES = 1 << 20  # event frames decoded together (numpy's temporaries stay small)
FEW_BYTES = 16 << 10  # event frames decoded together below which msgspec decodes them


class Torn(NamedTuple):
    """The file ends in a torn frame at byte `where`; every complete frame before it was read."""

    where: int


# What `read_trace` yields: the header first, then event chunks (objects, or columns when the
# caller passed kind codes; see framecolumns.py), clock records, and a Torn at a torn end.
Record = FileHeader | Clock | list[Event] | EventColumns | Torn

_decode_events = msgspec.msgpack.Decoder(list[ANY_EVENT]).decode
_decode_clock = msgspec.msgpack.Decoder(Clock).decode


def decode_events(payload: bytes | memoryview) -> list[Event]:
    """The events of an EVENTS frame's payload, within ddpviz's limits (else msgspec's
    ValidationError or limits.LimitError, naming the field)."""
    chunk = cast("list[Event]", _decode_events(payload))
    limits.check_events(chunk)
    return chunk


def decode_clock(payload: bytes | memoryview) -> Clock:
    """The record of a CLOCK frame's payload."""
    return _decode_clock(payload)


def read_trace(path: Path, data: bytes | None = None, *,
               partial: Callable[[], Any] = lambda: None,
               codes: Mapping[type[Event], int] | None = None) -> Iterator[Record]:
    """The records of the `.ddpviz` file at `path` (or of `data`, its bytes; `path` then only
    names it in messages), in file order except that event chunks may come a little after the
    clock records that follow them. A torn last frame (the writer died mid-write) ends it with a
    warning and a `Torn`; anything else unreadable raises TraceError, also a file that shrinks
    while it is read. `partial()` is what a TraceError that keeps the events read so far
    carries (the caller's container of everything yielded until then). With `codes` (kind code
    per event type, see columns.py), frames of hot events come as EventColumns."""
    if data is not None:
        yield from _walk(_Source(path, data=data), partial, codes)
        return
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < WHOLE_BELOW:
            yield from _walk(_Source(path, data=f.read()), partial, codes)
        else:
            # A big file is read a window at a time, never whole onto the heap. Not mapped: a
            # mapped file that shrinks under the parse (a new `ddpviz record` truncating it, a
            # file on NFS rewritten by another node) kills the process with SIGBUS; a short
            # read here is a TraceError.
            yield from _walk(_Source(path, fd=f.fileno(), size=size), partial, codes)


class _Source:
    """The bytes of a trace: all of them (`data`), or a file read a window at a time."""

    def __init__(self, path: Path, *, data: bytes | None = None, fd: int = -1,
                 size: int = 0) -> None:
        self.path = path
        self.fd = fd
        self.buf = memoryview(data if data is not None else b"")
        self.base = 0  # file offset of buf[0]
        self.size = len(data) if data is not None else size
        self._window = bytearray()  # reused: fresh memory costs a page fault per 4 KiB

    def has(self, pos: int, n: int) -> bool:
        """Whether get(pos, n) returns bytes read before (else it reads over them)."""
        n = min(n, self.size - pos)
        return self.base <= pos and pos + n <= self.base + len(self.buf)

    def get(self, pos: int, n: int) -> tuple[memoryview, int]:
        """(buffer, offset in it) of the bytes [pos, pos + n) of the file: all n of them, or
        up to its end when fewer are left (a declared length never sizes more than the file).
        A read overwrites the buffer of the bytes returned before."""
        if self.has(pos, n):
            return self.buf, pos - self.base
        n = min(n, self.size - pos)
        want = max(n, min(WINDOW, self.size - pos))
        if len(self._window) < want:
            self.buf = memoryview(b"")  # (no view may be left on a bytearray that grows)
            self._window = bytearray(want)
        got = memoryview(self._window)[:os.preadv(self.fd, [memoryview(self._window)[:want]],
                                                  pos)]
        if len(got) < n:
            self._changed(pos)
        self.buf, self.base = got, pos
        return self.buf, 0

    def _changed(self, pos: int) -> NoReturn:
        now = os.fstat(self.fd).st_size
        raise TraceError(
            f"ddpviz: {str(self.path)!r} changed while it was being read: it was "
            f"{self.size:,} bytes, a read at byte {pos:,} found {now:,} (another "
            "process truncated or rewrote it).\nLoad it again once the writer "
            "is done, or load a copy.")

    def frame(self, pos: int, n: int, crc: int) -> tuple[memoryview, int] | None:
        """What get(pos, n) returns if the file holds all n bytes and their CRC is `crc`, else
        None. A declared length sizes no buffer before its bytes are known to be there: a
        frame past the end is not read, and one bigger than a window has its CRC checked a
        window at a time first (a sparse file of 4 KiB on disk whose frame claimed 4 GiB got a
        4 GiB buffer, MemoryError under a cap, before its checksum failed)."""
        if n > self.size - pos:
            if self.fd >= 0 and os.fstat(self.fd).st_size < self.size:
                self._changed(pos)  # (not a torn tail: the file shrank under the read)
            return None
        checked = False
        step = max(WINDOW, 1 << 20)  # (tests set WINDOW to 0 to read frame by frame)
        if n > step and not self.has(pos, n):
            check = 0
            for at in range(pos, pos + n, step):
                piece = min(step, pos + n - at)
                buf, i = self.get(at, piece)
                check = zlib.crc32(buf[i:i + piece], check)
            if check != crc:
                return None
            checked = True
        buf, at = self.get(pos, n)
        return (buf, at) if checked or zlib.crc32(buf[at:at + n]) == crc else None


def _walk(src: _Source, partial: Callable[[], Any],
          codes: Mapping[type[Event], int] | None) -> Iterator[Record]:
    """The frames after the magic, as records (see read_trace)."""
    path, end = src.path, src.size
    head, at = src.get(0, len(MAGIC))
    if bytes(head[at:at + len(MAGIC)]) != MAGIC:
        _not_a_trace(path)
    pos = len(MAGIC)
    header = False
    events = 0  # yielded so far
    batch = _Batch(path, codes)  # complete event frames not yet decoded, all in one buffer
    while pos < end:
        where = pos
        if end - pos < FRAME.size:
            if not header:
                break  # no header frame: TraceError below
            yield from batch.flush()
            _torn(path, where, "a frame header is cut short")
            yield Torn(where)
            break
        if batch.frames and (batch.nbytes >= DECODE_BYTES or not src.has(pos, FRAME.size)):
            events += yield from batch.flush()  # (before a read overwrites its frames)
        buf, at = src.get(pos, FRAME.size)
        kind, length, crc = FRAME.unpack_from(buf, at)
        pos += FRAME.size
        if batch.frames and not src.has(pos, length):
            events += yield from batch.flush()
        try:
            got = src.frame(pos, length, crc)
        except MemoryError:  # (a length checked against the bytes: the buffer is all it costs)
            raise TraceError(
                f"ddpviz: {str(path)!r}: the frame at byte {where:,} holds {length:,} bytes, "
                f"more than this process can allocate; {events:,} events were read before "
                "it.\nLoad the file where more memory is free, or catch the error and take its "
                "`.partial` trace (the events before that frame).", partial()) from None
        pos += length
        if got is None:
            events += yield from batch.flush()
            if pos >= end and header:
                check_past_end(path, where, length, end - where - FRAME.size, events,
                               partial())
                _torn(path, where, "the last frame is incomplete")
                yield Torn(where)
                break
            what = "fails its checksum" if header else (
                "is not a complete header frame (garbage after the magic?)")
            raise TraceError(f"ddpviz: {str(path)!r} is corrupt: frame at byte {where} "
                             f"{what}.\nThe file was modified after writing; "
                             "restore it from the original run.")
        buf, at = got
        payload = buf[at:at + length]
        if not header:
            with _decoding(path, where):
                file_header = read_header(path, kind, payload)
            yield file_header
            header = True
        elif kind == EVENTS:
            batch.add(where, buf, at, length)
        elif kind == CLOCK:
            with _decoding(path, where):
                record = decode_clock(payload)
            yield record
        elif kind == COPY:  # (See [Note: the COPY frame])
            events += yield from batch.flush()  # its sources, and its ranks' events before it
            with _decoding(path, where):
                copied = batch.sources.resolve(decode_copies(payload))
            events += len(copied)
            yield copied
        elif kind == COLUMNS:  # (See [Note: the COLUMNS frame] in columnframe.py)
            events += yield from batch.flush()  # (the events before it come first)
            with _decoding(path, where):
                block = decode_columns(payload, codes if codes is not None else CODE)
            events += len(block)
            yield block if codes is not None else events_of(block, CODE)
        # other kinds: records from a later minor format; skip them
    yield from batch.flush()
    if not header:
        raise TraceError(f"ddpviz: {str(path)!r} has no header frame (empty trace file).\n"
                         "The writer died before writing anything; rerun the job.")


class _Batch:
    """Event frames read but not yet decoded, all in one buffer: decoded together (into columns
    when the caller passed kind codes: see framecolumns.py), in file order."""

    def __init__(self, path: Path, codes: Mapping[type[Event], int] | None) -> None:
        self.path = path
        self.codes = codes
        self.buf = memoryview(b"")
        self.frames: list[tuple[int, int, int]] = []  # (where, start in buf, length)
        self.nbytes = 0
        self.seen = RareCache()  # big rare events decoded so far (the same on every rank)
        self.sources = Sources()  # the events a COPY frame may repeat

    def add(self, where: int, buf: memoryview, at: int, length: int) -> None:
        self.buf = buf
        self.frames.append((where, at, length))
        self.nbytes += length

    def flush(self) -> Generator[list[Event] | EventColumns, None, int]:
        """Yields the frames' events; returns how many."""
        frames, nbytes = self.frames, self.nbytes
        self.frames, self.nbytes = [], 0
        n = 0
        buf = self.buf
        # (a few rare events between COLUMNS frames: msgspec decodes them faster than the
        # numpy reader's fixed cost, ~1.5 ms a call)
        decoded = (decode_frames(buf, [(at, length) for _, at, length in frames], self.codes,
                                 self.seen, True)  # (joined)
                   if self.codes is not None and nbytes >= FEW_BYTES
                   else [None] * len(frames))
        for (where, at, length), columns in zip(frames, decoded, strict=True):
            if columns is not None:
                n += len(columns)
                self.sources.add(columns.rare.values())
                yield columns
                continue
            with _decoding(self.path, where):
                chunk = decode_events(buf[at:at + length])
            n += len(chunk)
            self.sources.add(chunk)
            yield chunk
        return n


class _decoding:
    """Turns what decoding a frame raises into a TraceError naming the frame."""

    def __init__(self, path: Path, where: int) -> None:
        self.path, self.where = path, where

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None,
                 tb: object) -> None:
        if isinstance(e, msgspec.MsgspecError | ValueError | RecursionError):
            raise TraceError(f"ddpviz: {str(self.path)!r}: frame at byte {self.where} does "
                             f"not decode within ddpviz's limits: {printable(e)}.\nThe file "
                             "is damaged, hostile, or was written by an incompatible ddpviz "
                             "(limits: ddpviz/limits.py).") from None


def _not_a_trace(path: Path) -> NoReturn:
    raise TraceError(f"ddpviz: {str(path)!r} is not a ddpviz trace (no {MAGIC!r} magic at "
                     "its start).\nPass a file written by Trace.save, TraceWriter or "
                     "ddpviz.connect().")


def read_header(path: Path, kind: int, payload: bytes | memoryview) -> FileHeader:
    """A file's header frame (also ddpviz/session/follow.py's), versions and metadata checked."""
    if kind != HEADER:
        raise TraceError(f"ddpviz: {str(path)!r}: the first frame is not a header.\nThe file "
                         "is damaged; restore it from the original run.")
    fmt = msgspec.msgpack.decode(payload, type=Format).format
    if fmt not in READ_FORMATS:
        raise TraceError(f"ddpviz: {str(path)!r} is trace format {fmt}; this ddpviz reads "
                         f"formats {', '.join(map(str, READ_FORMATS[:-1]))} and "
                         f"{READ_FORMATS[-1]}.\nUse the ddpviz version that wrote it.")
    header = msgspec.msgpack.decode(payload, type=FileHeader)
    limits.check_meta(header.meta)
    if header.schema != SCHEMA_VERSION:
        raise TraceError(f"ddpviz: {str(path)!r} holds event schema {header.schema}; this "
                         f"ddpviz reads schema {SCHEMA_VERSION}.\nUse the ddpviz version that "
                         "wrote it.")
    return header


# --- reading a file still being written -------------------------------------------------------

MAX_FRAME = 256 << 20  # a frame of a growing file claiming more is damage (a chunk is a few MB)
TailRecord = FileHeader | list[Event] | Clock | End

# [Note: a bad last frame]
# A last frame failing its checksum is waited for (its bytes may not all be visible yet), but
# reading it again at every poll lets one planted file (a sparse one claiming a MAX_FRAME frame)
# cost a core and MAX_FRAME of memory churn per poll for as long as it is followed. So its
# reader remembers it with the file's stamp (the caller's: session/follow.py uses inode, size,
# mtime and ctime once the file's last change is a few seconds old, since timestamps are coarse)
# and reads it again only once the stamp or the size read to differs: a writer finishing the
# frame changes the file, so nothing legitimate is missed.


class TailReader:
    """A `.ddpviz` file that a running job still appends to, read frame by frame from where the
    last read stopped (`ddpviz.listen(follow=DIR)`, session/follow.py: See [Note: following a
    growing file] there). Only whole frames are taken: one cut short by the file's current end
    is left for the next read, and so is a last frame whose checksum fails (its bytes may not
    all be visible yet); a bad frame with bytes after it is damage. Such a last frame is read
    once per state of the file (its `stamp`), not at every read: See [Note: a bad last frame].

    Args:
        path: the file (names it in messages; reads go through the caller's descriptor).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pos = 0  # bytes consumed: every whole frame before it (0: not even the magic)
        self.events = 0  # events read so far
        self.more = False  # the last read stopped at its budget with whole frames left
        self._header = False
        self._failed: tuple[int, int, Hashable] | None = None  # (pos, size, stamp) of a bad end
        self._sources = Sources()  # the events a COPY frame may repeat

    @property
    def failed(self) -> int | None:
        """The offset of the last frame that failed its checksum and is not read again until
        the file changes (None: no such frame)."""
        return self._failed[0] if self._failed is not None else None

    def read(self, fd: int, size: int, budget: int, stamp: Hashable = None
             ) -> Iterator[TailRecord]:
        """The records of the whole frames between `pos` and `size` (the file's size now),
        read with `os.pread` on `fd`: the header first, then event chunks, clock and end
        records in file order (a COPY frame's copies as an event chunk; other kinds, of a later
        minor format, are skipped). `pos` moves
        past each frame before its record is yielded; it stops once about `budget` bytes were
        read (`more`). A file shorter than its magic and first frame header yields nothing.
        `stamp` says the file's state (None: unknown); a last frame that failed its checksum
        at the same `size` and `stamp` is not read again (`failed`).

        Raises:
            TraceError: no magic, a frame claiming more than MAX_FRAME, a bad checksum before
                the last frame, a frame that does not decode within ddpviz's limits; records
                yielded before it stay read.
        """
        self.more = False
        if self._failed is not None:
            if stamp is not None and self._failed == (self.pos, size, stamp):
                return  # the same bad last frame, the file unchanged: nothing new to read
            self._failed = None
        if self.pos == 0:
            if size < len(MAGIC) + FRAME.size:
                return
            if os.pread(fd, len(MAGIC), 0) != MAGIC:
                raise TraceError(f"ddpviz: {str(self.path)!r} is not a ddpviz trace (no "
                                 f"{MAGIC!r} magic at its start).\nIt is left out; remove it "
                                 "from the folder.")
            self.pos = len(MAGIC)
        start = self.pos
        while size - self.pos >= FRAME.size:
            if self.pos - start >= budget:
                self.more = True
                break
            where = self.pos
            head = os.pread(fd, FRAME.size, where)
            if len(head) < FRAME.size:
                break  # shrank under the read: the caller's next look says so
            kind, length, crc = FRAME.unpack(head)
            if length > MAX_FRAME:  # bounded before it sizes a read
                raise TraceError(
                    f"ddpviz: {str(self.path)!r}: the frame at byte {where:,} claims "
                    f"{length:,} bytes, more than any ddpviz frame: the file is damaged or "
                    f"hostile past that point.\nThe {self.events:,} events before it are "
                    "kept; the rest of the file is not read.")
            end = where + FRAME.size + length
            if end > size:
                break  # the frame is still being written: next read
            payload = os.pread(fd, length, where + FRAME.size)
            if len(payload) < length:
                break  # shrank under the read
            if zlib.crc32(payload) != crc:
                if end == size:  # the newest frame, perhaps not all there yet: next read
                    if stamp is not None:
                        self._failed = (where, size, stamp)
                    break
                raise TraceError(
                    f"ddpviz: {str(self.path)!r} is corrupt: the frame at byte {where:,} fails "
                    f"its checksum.\nThe {self.events:,} events before it are kept; the rest "
                    "of the file is not read.")
            record = self._decode(kind, payload, where)
            self.pos = end
            if record is not None:
                yield record

    def _decode(self, kind: int, payload: bytes, where: int) -> TailRecord | None:
        try:
            if not self._header:
                header = read_header(self.path, kind, payload)
                self._header = True
                return header
            if kind == EVENTS:
                chunk = decode_events(payload)
                self.events += len(chunk)
                self._sources.add(chunk)
                return chunk
            if kind == COPY:  # (a sender writes none; a view's bytes saved to a file may)
                chunk = self._sources.resolve(decode_copies(payload))
                self.events += len(chunk)
                return chunk
            if kind == COLUMNS:  # (Trace.save writes them: See columnframe.py)
                chunk = events_of(decode_columns(payload, CODE), CODE)
                self.events += len(chunk)
                return chunk
            if kind == CLOCK:
                return decode_clock(payload)
            if kind == END:
                return decode_end(payload)
            return None
        except (msgspec.MsgspecError, ValueError, RecursionError) as e:
            if isinstance(e, TraceError):
                raise
            raise TraceError(f"ddpviz: {str(self.path)!r}: the frame at byte {where:,} does "
                             f"not decode within ddpviz's limits: {printable(e)}.\nThe "
                             f"{self.events:,} events before it are kept; the rest of the file "
                             "is not read (limits: ddpviz/limits.py).") from None


def _torn(path: Path, where: int, what: str) -> None:
    warnings.warn(f"ddpviz: {str(path)!r} ends in a torn frame at byte {where} ({what}); "
                  "the writer stopped mid-write, or is still writing (a running job).\n"
                  "Everything before it was loaded; a running job's later events are in the "
                  "file once written (`ddpviz.listen(follow=DIR)` follows them live).",
                  UserWarning, stacklevel=6)


_MAX_CLOCK_NS = 100 * 365 * 86400 * 10**9  # wall and monotonic clocks in a file's meta
_MAX_WALL_OFFSET_NS = 10 * 365 * 86400 * 10**9  # two hosts' boot times differ by less


def wall_offset(meta: dict[str, Any], ref: dict[str, Any]) -> tuple[int, int]:
    """(offset, error) of a per-rank file's clock onto the reference file's clock. The meta is
    untrusted: an absurd clock (which would overflow the timeline's int64 times) is ignored,
    with a note, and the file is left unaligned."""
    if meta.get("boot") and meta.get("boot") == ref.get("boot"):
        return (0, 0)  # same kernel: same monotonic clock
    keys = ("wall_ns", "mono_ns")
    if not all(type(m.get(k)) is int for m in (meta, ref) for k in keys):
        return (0, -1)  # unknown
    offset = (meta["wall_ns"] - meta["mono_ns"]) - (ref["wall_ns"] - ref["mono_ns"])
    if (any(not 0 <= m[k] <= _MAX_CLOCK_NS for m in (meta, ref) for k in keys)
            or abs(offset) > _MAX_WALL_OFFSET_NS):
        warnings.warn(f"ddpviz: ignoring the clocks in a merged file's metadata (rank "
                      f"{str(meta.get('rank'))[:20]}: wall_ns={str(meta['wall_ns'])[:24]}, "
                      f"mono_ns={str(meta['mono_ns'])[:24]}): they are out of any real "
                      "range, so its events are not aligned with the other files' (offset 0)."
                      "\nThe file is damaged or hostile; its events are kept as recorded.",
                      UserWarning, stacklevel=3)
        return (0, -1)
    return (offset, -1)
