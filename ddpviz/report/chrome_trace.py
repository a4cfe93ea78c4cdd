"""The Chrome/Perfetto trace JSON of a Trace (open it in ui.perfetto.dev or chrome://tracing).

Ranks are processes; phases, all-reduces, broadcast chunks and, on steps recorded at an
aggregated detail level, the per-bucket "gradients ready bN (summary of K)" intervals are spans
("X", see Trace.spans); gradient hooks and every other event are instants. The JSON (UTF-8 bytes) is
written straight from the columnar store (ddpviz/traces/columns.py): gradient hooks a column at a
time as fixed-width records of numbers only (json_numbers), never built as objects; bucket
readiness from a template of numbers; rare events and spans through msgspec's JSON encoder
(which escapes their strings).
"""

from __future__ import annotations

import json
import os
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgspec
import numpy as np

from ddpviz import json_numbers
from ddpviz.atomic import streaming
from ddpviz.model.spans import SPAN_TYPES, Span, event_args, table_spans
from ddpviz.traces import columns as col
from ddpviz.traces.columns import Table
from ddpviz.traces.trace import Trace, gc_paused

_SPAN_CODES = col.codes(*SPAN_TYPES)
_BUCKET_READY = (b'{"name":"BucketReady","cat":"event","ph":"i","s":"t","pid":%d,"tid":%d,'
                 b'"ts":%a,"args":{"step":%d,"seq":%d,"bucket":%d}}')
_BATCH = 1 << 16  # instants formatted per piece
_WRITE = 4 << 20  # bytes gathered per write


_dumps = msgspec.json.encode  # compact JSON bytes (NaN and infinities as null)


class _Lanes:
    """Thread ids per (rank, lane) in order of first use, with their metadata records."""

    def __init__(self) -> None:
        self.tids: dict[tuple[int, str], int] = {}
        self.count: dict[int, int] = {}  # rank -> lanes so far

    def tid(self, rank: int, lane: str, out: list[bytes]) -> int:
        key = (rank, lane)
        n = self.tids.get(key)
        if n is None:
            self.tids[key] = n = self.count.get(rank, 0)
            self.count[rank] = n + 1
            out.append(_dumps({"ph": "M", "name": "thread_name", "pid": rank, "tid": n,
                               "args": {"name": lane}}))
            out.append(_dumps({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": n,
                               "args": {"sort_index": n}}))
        return n


def _span_text(s: Span, tid: int, t0: int) -> bytes:
    return _dumps({"name": s.name, "cat": s.cat, "ph": "X", "pid": s.rank, "tid": tid,
                   "ts": (s.start_ns - t0) / 1000, "dur": max(0, s.end_ns - s.start_ns) / 1000,
                   "args": s.args})


def _grad_block(table: Table, rows: np.ndarray, rank: int, tid: int, shift: int
                ) -> tuple[bytes, int]:
    """The instants of GradReady `rows` as fixed-width records, each after a comma."""
    return json_numbers.records([
        b',{"name":"grad p', json_numbers.digits_then_quote(table.a[rows]),
        b',"cat":"hook","ph":"i","s":"t","pid":%d,"tid":%d,"ts":' % (rank, tid),
        json_numbers.micros(table.t[rows] + shift),
        b',"args":{"step":', json_numbers.integers(table.step[rows]),
        b',"seq":', json_numbers.integers(table.seq[rows]),
        b',"param":', json_numbers.integers(table.a[rows]),
        b',"bucket":', json_numbers.integers(table.b[rows]), b"}}"])


def _instants(table: Table, offset: int, t0: int, lanes: _Lanes) -> Iterator[bytes]:
    """One rank's instants in arrival order, as pieces of JSON text each starting with a comma:
    the hooks as runs of fixed-width records, other events one by one."""
    rank = table.rank
    rows = np.flatnonzero(~np.isin(table.kind, _SPAN_CODES))
    if not len(rows):
        return
    is_grad = table.kind[rows] == col.GRAD_READY
    # lanes get their thread ids in the order their first instant comes, metadata before it
    firsts = []
    grads = np.flatnonzero(is_grad)
    others = np.flatnonzero(~is_grad)
    if len(grads):
        firsts.append((int(grads[0]), "gradient hooks"))
    if len(others):
        firsts.append((int(others[0]), "events"))
    header: dict[int, bytes] = {}
    tid: dict[str, int] = {}
    for pos, lane in sorted(firsts):
        meta: list[bytes] = []
        tid[lane] = lanes.tid(rank, lane, meta)
        header[pos] = b"," + b",".join(meta)
    shift = offset - t0
    for start in range(0, len(rows), _BATCH):
        stop = min(start + _BATCH, len(rows))
        g = grads[(grads >= start) & (grads < stop)]
        block, width = (_grad_block(table, rows[g], rank, tid["gradient hooks"], shift)
                        if len(g) else (b"", 0))
        breaks = sorted({*others[(others >= start) & (others < stop)].tolist(),
                         *(p for p in header if start <= p < stop)})
        done = 0  # grad records written so far from this block
        for pos in breaks:
            upto = int(np.searchsorted(g, pos))
            if upto > done:
                yield block[done * width:upto * width]
                done = upto
            if pos in header:
                yield header[pos]
            if not is_grad[pos]:
                yield b"," + _instant_text(table, int(rows[pos]), rank, tid["events"], shift)
        if done < len(g):
            yield block[done * width:]


def _instant_text(table: Table, row: int, rank: int, tid: int, shift: int) -> bytes:
    if table.kind[row] == col.BUCKET_READY:
        return _BUCKET_READY % (rank, tid, (int(table.t[row]) + shift) / 1000,
                                int(table.step[row]), int(table.seq[row]), int(table.a[row]))
    e = table.objects[row]
    return _dumps({"name": type(e).__name__, "cat": "event", "ph": "i", "s": "t", "pid": rank,
                   "tid": tid, "ts": (e.t_ns + shift) / 1000, "args": event_args(e)})


def chrome_trace_pieces(trace: Trace) -> Iterator[bytes]:
    """The JSON document of `trace` in pieces (join them, or write them one by one)."""
    tables = trace.columns()
    clock = dict(trace.clock)
    offsets = {r: clock.get(r, (0, 0))[0] for r in tables}
    spans = {r: table_spans(t, offsets[r]) for r, t in tables.items()}
    starts = [min(s.start_ns for s in sp) for sp in spans.values() if sp]
    starts += [int(t.t[0]) + offsets[r] for r, t in tables.items() if len(t)]
    t0 = min(starts) if starts else 0
    lanes = _Lanes()
    yield b'{"traceEvents":['
    first = True

    def joined(items: list[bytes]) -> bytes:
        nonlocal first
        if not items:
            return b""
        text = (b"" if first else b",") + b",".join(items)
        first = False
        return text

    head: list[bytes] = []
    for rank in tables:
        head.append(_dumps({"ph": "M", "name": "process_name", "pid": rank,
                            "args": {"name": f"rank {rank}"}}))
        head.append(_dumps({"ph": "M", "name": "process_sort_index", "pid": rank,
                            "args": {"sort_index": rank}}))
        lanes.tid(rank, "phases", head)
    yield joined(head)
    for sp in spans.values():
        out: list[bytes] = []
        for s in sp:
            tid = lanes.tid(s.rank, s.lane, out)
            out.append(_span_text(s, tid, t0))
        yield joined(out)
    for rank, table in tables.items():
        yield from _instants(table, offsets[rank], t0, lanes)
    other = {"generator": "ddpviz",
             "clock": {str(r): {"offset_ns": o, "error_ns": err} for r, (o, err) in clock.items()},
             "meta": trace.meta}
    yield b'],"displayTimeUnit":"ms","otherData":' + _dumps(other) + b"}"


def write_chrome_trace(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Stream the Chrome trace JSON of `trace` into `path` (atomic: a failed write keeps the
    old file and raises SaveError). Returns the path. A thread writes while the next pieces
    are formatted (the file is ~170 bytes per event: the disk is half the work)."""
    with gc_paused(), streaming(path) as f:
        writer = _Writer(f)
        try:
            pending: list[bytes] = []
            size = 0
            for piece in chrome_trace_pieces(trace):
                pending.append(piece)
                size += len(piece)
                if size >= _WRITE:
                    writer.put(b"".join(pending))
                    pending, size = [], 0
            writer.put(b"".join(pending))
        finally:
            writer.close()  # raises what a write raised (a full disk: SaveError from streaming)
    return Path(path)


class _Writer:
    """Writes chunks to a file on its own thread (writes release the GIL), a few ahead at
    most; the first error a write raises is raised again by `put` or `close`."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=4)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ddpviz-chrome-writer",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while (chunk := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._f.write(chunk)
                except BaseException as exc:  # handed to the caller's thread
                    self._error = exc

    def put(self, chunk: bytes) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(chunk)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error


def chrome_trace_doc(trace: Trace) -> dict[str, Any]:
    """The Chrome trace JSON of `trace` as Python objects (what Trace.to_chrome_trace returns)."""
    with gc_paused():
        doc: dict[str, Any] = json.loads(b"".join(chrome_trace_pieces(trace)))
    return doc
