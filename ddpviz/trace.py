"""Traces: the events of a run kept per rank, saved to `.ddpviz` files, exported for Perfetto.

A `.ddpviz` file is data only (msgpack through msgspec's typed decoders, never pickle):
the 8-byte magic, then frames `kind (u8) | length (u32 LE) | crc32 (u32 LE) | payload`. The
first frame is the header (format and event-schema versions, metadata); then event chunks and
clock records in any order. `TraceWriter` appends and flushes frame by frame, so a writer that
dies mid-run leaves every flushed frame loadable; `Trace.load` keeps the complete frames before
a torn last one and warns. Times: see `Trace.aligned_ns` and [Note: clock alignment].
"""

from __future__ import annotations

import contextlib
import gc
import operator
import os
import threading
import warnings
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast, overload

import msgspec

from ddpviz import limits
from ddpviz.atomic import replacing
from ddpviz.columns import RankColumns, Shared, Table, by_rank
from ddpviz.events import ANY_EVENT, SCHEMA_VERSION, E, Event
from ddpviz.model.spans import Span, table_spans

# The file format and writer live in tracefile.py (imported by transport/ too); the names the
# reader below uses are kept here under their old spellings.
from ddpviz.tracefile import CLOCK as _CLOCK
from ddpviz.tracefile import EVENTS as _EVENTS
from ddpviz.tracefile import FORMAT_VERSION as FORMAT_VERSION
from ddpviz.tracefile import FRAME as _FRAME
from ddpviz.tracefile import HEADER as _HEADER
from ddpviz.tracefile import MAGIC as _MAGIC
from ddpviz.tracefile import SUFFIX as SUFFIX
from ddpviz.tracefile import Clock as _Clock
from ddpviz.tracefile import FileHeader as _FileHeader
from ddpviz.tracefile import Format as _Format
from ddpviz.tracefile import TraceError as TraceError
from ddpviz.tracefile import TraceWriter as TraceWriter
from ddpviz.tracefile import check_past_end

if TYPE_CHECKING:
    from ddpviz.widgets.dashboard import Dashboard

_CHUNK = 8192  # events per frame when saving a whole trace
_RANK = operator.attrgetter("rank")
_WHOLE_BELOW = 64 << 20  # smaller files are read whole; bigger ones frame by frame


class Trace:
    """The events of a run, per rank, in the order each rank emitted them. Thread-safe.

    Kept as columns (ddpviz/columns.py, a few dozen bytes per event): `columns()` is what the
    analyses read; `events()` and `of_type()` rebuild the typed events, equal to those added.

    Args:
        events: initial events (any ranks).
        meta: plain data describing the run.
        clock: {rank: (offset_ns, error_ns)}: offsets onto the reference clock.
    """

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, events: Iterable[Event] = (), *, meta: dict[str, Any] | None = None,
                 clock: dict[int, tuple[int, int]] | None = None) -> None:
        self._lock = threading.Lock()
        self._by_rank: dict[int, RankColumns] = {}  # columns per rank (see ddpviz/columns.py)
        self._shared = Shared()  # one copy of the payloads ranks report alike
        self.meta: dict[str, Any] = dict(meta or {})
        self.clock: dict[int, tuple[int, int]] = dict(clock or {})
        self.truncated = False  # set by load() when the file ended in a torn frame
        self.extend(events)

    # --- recording ----------------------------------------------------------------------------

    def _rank_columns(self, rank: int) -> RankColumns:
        cols = self._by_rank.get(rank)
        if cols is None:
            cols = self._by_rank[rank] = RankColumns(rank, self._shared)
        return cols

    def append(self, event: Event) -> None:
        """Add one event at the end of its rank's events (the rank is `event.rank`).

        Args:
            event: any ddpviz event; it is stored as columns, so `events()` later rebuilds
                an equal object, not this one.
        """
        with self._lock:
            self._rank_columns(event.rank).add((event,))

    def extend(self, events: Iterable[Event]) -> None:
        """Add events in order, each at the end of its own rank's events.

        Args:
            events: events of any ranks, e.g. a chunk a collector received; a batch of one
                rank's events (the usual case) is added under one lock.
        """
        batch = events if isinstance(events, list) else list(events)
        if not batch:
            return
        rank = batch[0].rank
        if batch[-1].rank == rank and len(set(map(_RANK, batch))) == 1:
            with self._lock:  # the usual case: one rank's chunk or message
                self._rank_columns(rank).add(batch)
            return
        grouped = by_rank(batch)
        with self._lock:
            for r, lst in grouped.items():
                self._rank_columns(r).add(lst)

    def set_clock(self, rank: int, offset_ns: int, error_ns: int) -> None:
        """Record how `rank`'s clock maps onto the reference clock (see `aligned_ns`).

        Args:
            rank: the rank whose clock this is; a later call for the same rank replaces it.
            offset_ns: nanoseconds to add to the rank's `t_ns` to get reference time.
            error_ns: a bound on the offset's error in nanoseconds (half the round trip of
                the ping that measured it); -1 when unknown (hosts aligned by wall clock).
        """
        with self._lock:
            self.clock[rank] = (offset_ns, error_ns)

    # --- reading ------------------------------------------------------------------------------

    @property
    def ranks(self) -> list[int]:
        """The ranks that have at least one event, ascending."""
        with self._lock:
            return sorted(self._by_rank)

    def columns(self, rank: int | None = None) -> dict[int, Table]:
        """Snapshots of the ranks' columns: what the analyses read instead of event objects.

        Args:
            rank: just this rank's; None (default): every rank's.

        Returns:
            A dict of rank to Table (ddpviz/columns.py's read-only NamedTuple of numpy
            columns), in rank order; empty when `rank` has no events. Later additions do not
            change it.
        """
        with self._lock:
            chosen = sorted(self._by_rank) if rank is None else (
                [rank] if rank in self._by_rank else [])
            return {r: self._by_rank[r].table() for r in chosen}

    def events(self, rank: int | None = None) -> list[Event]:
        """The events, rebuilt from the columns on each call (a snapshot).

        Args:
            rank: just this rank's events, in the order it emitted them; None (default):
                every rank's, merged by aligned time (`aligned_ns`), ties by rank, then seq.

        Returns:
            A new list of events equal to those added; empty when `rank` has none.
        """
        if rank is not None:
            table = self.columns(rank).get(rank)
            return table.events() if table is not None else []
        with self._lock:
            clock = dict(self.clock)
        merged = [e for table in self._tables_in_insertion_order() for e in table.events()]
        merged.sort(key=lambda e: (e.t_ns + clock.get(e.rank, (0, 0))[0], e.rank, e.seq))
        return merged

    def _tables_in_insertion_order(self) -> list[Table]:
        with self._lock:
            return [c.table() for c in self._by_rank.values()]

    @overload
    def of_type(self, kind: type[E], /, *, rank: int | None = None) -> list[E]: ...
    @overload
    def of_type(self, *types: type[Event], rank: int | None = None) -> list[Event]: ...

    def of_type(self, *types: type[Event], rank: int | None = None) -> list[Any]:
        """The events of the given types, in `events(rank)` order.

        Args:
            types: event classes (`ddpviz.events.GradReady`, ...); an event of any of them
                is picked. With one class the result is typed as a list of it.
            rank: just this rank's events; None (default): every rank's.

        Returns:
            A new list of the matching events; empty when none match.
        """
        if rank is not None:
            table = self.columns(rank).get(rank)
            return table.events(table.rows(*types)) if table is not None else []
        with self._lock:
            clock = dict(self.clock)
        picked = [e for table in self._tables_in_insertion_order()
                  for e in table.events(table.rows(*types))]
        picked.sort(key=lambda e: (e.t_ns + clock.get(e.rank, (0, 0))[0], e.rank, e.seq))
        return picked

    def aligned_ns(self, event: Event) -> int:
        """`event.t_ns` on the reference clock (the collector's): t_ns + the rank's offset.

        Offsets are 0 on one host (a shared monotonic clock); see [Note: clock alignment].

        Args:
            event: an event of this trace (any event: only its `rank` and `t_ns` are read).

        Returns:
            Nanoseconds on the reference clock; `t_ns` unchanged for a rank without a clock
            record.
        """
        return event.t_ns + self.clock.get(event.rank, (0, 0))[0]

    def __len__(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._by_rank.values())

    def __iter__(self) -> Iterator[Event]:
        return iter(self.events())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        mine = {r: self.events(r) for r in self.ranks}
        theirs = {r: other.events(r) for r in other.ranks}
        return mine == theirs and self.clock == other.clock and self.meta == other.meta

    def __repr__(self) -> str:
        with self._lock:
            sizes = {r: len(c) for r, c in sorted(self._by_rank.items())}
        counts = ", ".join(f"rank {r}: {n}" for r, n in sizes.items())
        return f"<ddpviz Trace, {len(self)} events ({counts or 'empty'})>"

    # --- files --------------------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the whole trace to `path`: metadata, clock records, each rank's events.

        Atomic: written next to it, synced, then renamed into place (see ddpviz/atomic.py).

        Args:
            path: the file to write (conventionally `*.ddpviz`); an existing file is replaced.

        Returns:
            `path` as a `Path`.

        Raises:
            SaveError: the write failed (a full disk, no permission); the previous file at
                `path`, if any, is unchanged.
        """
        with replacing(path) as tmp, TraceWriter(tmp, meta=self.meta, chunk=_CHUNK) as w:
            for rank, (offset, error) in sorted(self.clock.items()):
                w.write_clock(rank, offset, error)
            for rank in self.ranks:
                w.write_many(self.events(rank))
                w.flush()
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trace:
        """Read a `.ddpviz` file (written by `save`, `TraceWriter`, `ddpviz record`).

        A torn last frame (the writer died mid-write, or is still writing) is skipped with a
        warning and `truncated` is set; every complete frame before it is kept. Files under
        64 MiB are read whole, bigger ones frame by frame.

        Args:
            path: the `.ddpviz` file.

        Returns:
            A new `Trace` with the file's events, metadata (`meta`) and clock records.

        Raises:
            TraceError: not a trace, a corrupt or hostile frame (checksum, limits), another
                format or schema version, or the file shrank while it was being read.
        """
        path = Path(path)
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < _WHOLE_BELOW:
                return cls.from_bytes(f.read(), path)
            # A big file is read frame by frame (frames are small), never whole onto the heap.
            # Not mapped: a mapped file that shrinks under the parse (a new `ddpviz record`
            # truncating it, a file on NFS rewritten by another node) kills the process with
            # SIGBUS; a short read here is a TraceError.
            fd = f.fileno()
            if os.pread(fd, len(_MAGIC), 0) != _MAGIC:
                _not_a_trace(path)

            def read(pos: int, n: int) -> bytes:
                n = min(n, size - pos)  # a declared length never sizes more than the file
                got = os.pread(fd, n, pos)
                if len(got) < n:
                    now = os.fstat(fd).st_size
                    raise TraceError(
                        f"ddpviz: {str(path)!r} changed while it was being read: it was "
                        f"{size:,} bytes, a read at byte {pos:,} found {now:,} (another "
                        "process truncated or rewrote it).\nLoad it again once the writer "
                        "is done, or load a copy.")
                return got

            with gc_paused():
                return cls._parse(read, size, path)

    @classmethod
    def from_bytes(cls, data: bytes, path: str | os.PathLike[str] = "<bytes>") -> Trace:
        """Like `load`, from the bytes of a `.ddpviz` file already in memory.

        Args:
            data: the whole file's bytes, magic included.
            path: only names the data in warnings and error messages.

        Returns:
            A new `Trace`, as `load` returns it.

        Raises:
            TraceError: as for `load`.
        """
        path = Path(path)
        if data[:len(_MAGIC)] != _MAGIC:
            _not_a_trace(path)
        view = memoryview(data)
        with gc_paused():
            return cls._parse(lambda pos, n: view[pos:pos + n], len(data), path)

    @classmethod
    def _parse(cls, read: Callable[[int, int], bytes | memoryview], end: int,
               path: Path) -> Trace:
        """The frames after the magic; `read(pos, n)` gives at most n bytes from pos (fewer
        only at the end)."""
        decode_events = msgspec.msgpack.Decoder(list[ANY_EVENT]).decode
        decode_clock = msgspec.msgpack.Decoder(_Clock).decode
        pos = len(_MAGIC)
        trace: Trace | None = None
        clock: dict[int, tuple[int, int]] = {}
        while pos < end:
            where = pos
            if end - pos < _FRAME.size:
                if trace is None:
                    break  # no header frame: TraceError below
                _torn(path, where, "a frame header is cut short")
                trace = trace or cls()
                trace.truncated = True
                break
            kind, length, crc = _FRAME.unpack(read(pos, _FRAME.size))
            pos += _FRAME.size
            payload = read(pos, length)
            pos += length
            last = pos >= end
            if len(payload) < length or zlib.crc32(payload) != crc:
                if last and trace is not None:
                    trace.clock.update(clock)  # (for a partial trace in the error below)
                    check_past_end(path, where, length, end - where - _FRAME.size, trace)
                    _torn(path, where, "the last frame is incomplete")
                    trace = trace or cls()
                    trace.truncated = True
                    break
                what = "fails its checksum" if trace is not None else (
                    "is not a complete header frame (garbage after the magic?)")
                raise TraceError(f"ddpviz: {str(path)!r} is corrupt: frame at byte {where} "
                                 f"{what}.\nThe file was modified after writing; "
                                 "restore it from the original run.")
            try:
                if trace is None:
                    trace = cls(meta=read_header(path, kind, payload))
                elif kind == _EVENTS:
                    chunk = cast("list[Event]", decode_events(payload))
                    limits.check_events(chunk)
                    trace.extend(chunk)  # into columns now: the objects go with the chunk
                elif kind == _CLOCK:
                    c = decode_clock(payload)
                    clock[c.rank] = (c.offset_ns, c.error_ns)
                # other kinds: records from a later minor format; skip them
            except (msgspec.MsgspecError, ValueError, RecursionError) as e:
                raise TraceError(f"ddpviz: {str(path)!r}: frame at byte {where} does not "
                                 f"decode within ddpviz's limits: {e}.\nThe file is damaged, "
                                 "hostile, or was written by an incompatible ddpviz (limits: "
                                 "ddpviz/limits.py).") from None
        if trace is None:
            raise TraceError(f"ddpviz: {str(path)!r} has no header frame (empty trace file).\n"
                             "The writer died before writing anything; rerun the job.")
        trace.clock.update(clock)
        return trace

    @classmethod
    def merge(cls, traces: Iterable[Trace]) -> Trace:
        """One trace from several (e.g. the per-rank files of `ddpviz.connect()` without
        DDPVIZ_CONNECT). Ranks on other hosts are aligned by wall clock when the files carry
        it (error: the hosts' NTP error); on the first file's host offsets stay 0.

        Args:
            traces: the traces to merge, the first one the reference (its metadata, less
                "rank", and its host's clock); traces should hold distinct ranks.

        Returns:
            A new `Trace` with every trace's events; empty when `traces` is.
        """
        traces = list(traces)
        merged = cls(meta=dict(traces[0].meta) if traces else None)
        ref = traces[0].meta if traces else {}
        for t in traces:
            merged.extend(t.events())
            for rank in t.ranks:
                merged.clock[rank] = t.clock.get(rank, wall_offset(t.meta, ref))
        merged.meta.pop("rank", None)
        return merged

    def dashboard(self, **kwargs: Any) -> Dashboard:
        """A replay Dashboard of this trace, with iteration and time sliders.

        Args:
            kwargs: passed to the Dashboard (`max_hz`, `timeline_bytes_per_s`, ...).

        Returns:
            The Dashboard widget (display it as a notebook cell's last value).
        """
        from ddpviz.widgets.dashboard import Dashboard

        return Dashboard(self, **kwargs)

    # --- export -------------------------------------------------------------------------------

    def spans(self) -> list[Span]:
        """Phases, all-reduces and broadcast chunks as intervals (see Span); on steps recorded
        at an aggregated detail level, one "gradients ready bN (summary of K)" span per bucket
        (cat "gradients": first to last gradient ready; per-parameter hooks not recorded).

        Returns:
            The spans of every rank, rank by rank, on the aligned clock; a span whose end
            event never came (a crash, a hang) has `finished=False`.
        """
        out: list[Span] = []
        for rank, table in self.columns().items():
            out.extend(table_spans(table, self.clock.get(rank, (0, 0))[0]))
        return out

    def to_chrome_trace(self, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """Chrome/Perfetto trace JSON: ranks as processes, phases, all-reduces and broadcast
        chunks as spans ("X"), gradient hooks and other events as instants. For big traces
        `write_chrome_trace`, which streams the file, is much leaner.

        Args:
            path: if given, the JSON is also written there (atomically), to open in
                ui.perfetto.dev or chrome://tracing; None (default): nothing is written.

        Returns:
            The JSON document as Python objects (a dict with "traceEvents").
        """
        from ddpviz.chrome_trace import chrome_trace_doc, write_chrome_trace

        if path is not None:
            write_chrome_trace(self, path)  # atomic, like every save
        return chrome_trace_doc(self)

    def write_chrome_trace(self, path: str | os.PathLike[str]) -> Path:
        """Write the Chrome/Perfetto trace JSON of `to_chrome_trace` to `path`, streamed from
        the columns (no object per event). Atomic, like `save`.

        Args:
            path: the `.json` file to write; an existing file is replaced.

        Returns:
            `path` as a `Path`.

        Raises:
            SaveError: the write failed; the previous file at `path` is unchanged.
        """
        from ddpviz.chrome_trace import write_chrome_trace

        return write_chrome_trace(self, path)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic GC inside: a million small objects (events, spans, dicts; no cycles) trip it
    over and over, which makes loading and exporting big traces superlinear."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _not_a_trace(path: Path) -> NoReturn:
    raise TraceError(f"ddpviz: {str(path)!r} is not a ddpviz trace (no {_MAGIC!r} magic at "
                     "its start).\nPass a file written by Trace.save, TraceWriter or "
                     "ddpviz.connect().")


def read_header(path: Path, kind: int, payload: bytes | memoryview) -> dict[str, Any]:
    """The metadata of a file's header frame (also ddpviz/follow.py's), versions checked."""
    if kind != _HEADER:
        raise TraceError(f"ddpviz: {str(path)!r}: the first frame is not a header.\nThe file "
                         "is damaged; restore it from the original run.")
    fmt = msgspec.msgpack.decode(payload, type=_Format).format
    if fmt != FORMAT_VERSION:
        raise TraceError(f"ddpviz: {str(path)!r} is trace format {fmt}; this ddpviz reads "
                         f"format {FORMAT_VERSION}.\nUse the ddpviz version that wrote it.")
    header = msgspec.msgpack.decode(payload, type=_FileHeader)
    limits.check_meta(header.meta)
    if header.schema != SCHEMA_VERSION:
        raise TraceError(f"ddpviz: {str(path)!r} holds event schema {header.schema}; this "
                         f"ddpviz reads schema {SCHEMA_VERSION}.\nUse the ddpviz version that "
                         "wrote it.")
    return header.meta


def _torn(path: Path, where: int, what: str) -> None:
    warnings.warn(f"ddpviz: {str(path)!r} ends in a torn frame at byte {where} ({what}); "
                  "the writer stopped mid-write, or is still writing (a running job).\n"
                  "Everything before it was loaded; a running job's later events are in the "
                  "file once written (`ddpviz.listen(follow=DIR)` follows them live).",
                  UserWarning, stacklevel=5)


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
