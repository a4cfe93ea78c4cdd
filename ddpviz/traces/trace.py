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
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

import numpy as np

from ddpviz.atomic import replacing
from ddpviz.events import E, Event
from ddpviz.model.event_model import EventModel
from ddpviz.model.spans import Span, table_spans
from ddpviz.traces.columnframe import summarizes
from ddpviz.traces.columns import CODE, RankColumns, Shared, Table, by_rank
from ddpviz.traces.fileformat import (
    Clock,
    EventColumns,
    FileHeader,
    Torn,
    TraceError,
    TraceWriter,
    read_trace,
    wall_offset,
)

__all__ = ["Trace", "TraceError", "gc_paused"]

if TYPE_CHECKING:
    from ddpviz.widgets.dashboard import Dashboard
    from ddpviz.widgets.trace_view import TraceView

CHUNK = 8192  # events per frame when saving a whole trace
_RANK = operator.attrgetter("rank")


class Trace:
    """The events of a run, per rank, in the order each rank emitted them. Thread-safe.

    Kept as columns (ddpviz/traces/columns.py, a few dozen bytes per event): `columns()` is what the
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
        self._by_rank: dict[int, RankColumns] = {}  # columns per rank (traces/columns.py)
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
            A dict of rank to Table (ddpviz/traces/columns.py's read-only NamedTuple of numpy
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
        with replacing(path) as tmp:
            write_run(self, tmp)
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Trace:
        """Read a `.ddpviz` file (written by `save`, `TraceWriter`, `ddpviz record`).

        A torn last frame (the writer died mid-write, or is still writing) is skipped with a
        warning and `truncated` is set; every complete frame before it is kept. Files under
        64 MiB are read whole, bigger ones 16 MiB at a time (see tracefile.read_trace).

        Args:
            path: the `.ddpviz` file.

        Returns:
            A new `Trace` with the file's events, metadata (`meta`) and clock records.

        Raises:
            TraceError: not a trace, a corrupt or hostile frame (checksum, limits), another
                format or schema version, or the file shrank while it was being read.
        """
        return cls._read(Path(path), None)

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
        return cls._read(Path(path), data)

    @classmethod
    def _read(cls, path: Path, data: bytes | None) -> Trace:
        """The trace of what tracefile.read_trace yields (the file format is tracefile.py's)."""
        trace = cls()
        with gc_paused():
            for record in read_trace(path, data, partial=lambda: trace, codes=CODE):
                if isinstance(record, list):
                    trace.extend(record)  # into columns now: the objects go with the chunk
                elif isinstance(record, EventColumns):
                    trace._add_columns(record)
                elif isinstance(record, Clock):
                    trace.clock[record.rank] = (record.offset_ns, record.error_ns)
                elif isinstance(record, FileHeader):
                    trace.meta = record.meta
                elif isinstance(record, Torn):
                    trace.truncated = True
        return trace

    def _add_columns(self, block: EventColumns) -> None:
        """Events decoded straight into columns, in file order (any ranks)."""
        rank = block.rank
        if not len(rank):
            return
        if rank[0] == rank[-1] and bool(np.all(rank == rank[0])):
            with self._lock:
                self._rank_columns(int(rank[0])).add_columns(block, None, block.rare)
            return
        order = np.argsort(rank, kind="stable")
        ranks, starts = np.unique(rank[order], return_index=True)
        bounds = [*starts.tolist(), len(order)]
        # The rare events split by rank once for the block, by their position among their
        # rank's rows (See [Note: a block of many ranks] in columns.py).
        rare: list[dict[int, Event]] = [{} for _ in bounds[:-1]]
        if block.rare:
            at = np.empty(len(order), dtype=np.int64)
            at[order] = np.arange(len(order))  # each row's place in rank order
            place = at[np.fromiter(block.rare, dtype=np.int64, count=len(block.rare))]
            owner = np.searchsorted(starts, place, side="right") - 1
            for e, p, i in zip(block.rare.values(), place.tolist(), owner.tolist(),
                               strict=True):
                rare[i][p - bounds[i]] = e
        with self._lock:
            for i, r in enumerate(ranks.tolist()):
                self._rank_columns(r).add_columns(block, order[bounds[i]:bounds[i + 1]],
                                                  rare[i])

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
        """A replay Dashboard of this trace, drawn in the browser (its replay bar moves
        every panel to any iteration or instant).

        Args:
            kwargs: passed to the Dashboard (`debugger`, `scheme`, `max_events`, `name`).

        Returns:
            The Dashboard widget (display it as a notebook cell's last value).
        """
        from ddpviz.widgets.dashboard import Dashboard

        return Dashboard(self, **kwargs)

    def view(self, **kwargs: Any) -> TraceView:
        """The JupyterLab trace viewer's panels for this trace, in any notebook host that
        renders anywidget (JupyterLab, Notebook 7, marimo, VS Code, Colab): drawn in the
        browser from the trace's bytes, so its pickers answer while the kernel is busy.

        Args:
            kwargs: passed to the TraceView (`scheme`, `max_events`).

        Returns:
            The TraceView widget (a notebook cell's last value; in marimo,
            `mo.ui.anywidget(trace.view())`).
        """
        from ddpviz.widgets.trace_view import TraceView

        return TraceView(self, **kwargs)

    def model(self) -> EventModel:
        """The run model of this trace: every rank's events folded on the trace's clock, what
        the advisor and the teaching notebooks read.

        Returns:
            A new `ddpviz.model.event_model.EventModel` on each call, which gives the
            constructor's state per rank with `construction()`, the bucket maps with `maps()`,
            each step's records with `step_records(step)` and the run's `status()`.
        """
        model = EventModel(self.clock)
        for table in self.columns().values():
            model.feed_table(table)
        return model

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
        from ddpviz.report.chrome_trace import chrome_trace_doc, write_chrome_trace

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
        from ddpviz.report.chrome_trace import write_chrome_trace

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


def write_run(trace: Trace, path: Path) -> None:
    """`trace` written to `path` as `Trace.save` writes it (COLUMNS and COPY frames; wide
    COLUMNS frames, format 3, where it holds GradsSummarized), but in place: no atomic replace,
    no fsync (what a view's bytes are written as, in a temporary folder: view_bytes.py)."""
    tables = trace.columns().values()
    with TraceWriter(path, meta=trace.meta, chunk=CHUNK, copies=True, columns=True,
                     summaries=summarizes(tables)) as w:
        w.write_ranks(trace.clock, tables)
