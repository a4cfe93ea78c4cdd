"""A run too big to send to the browser whole, with its gradient hooks summarized per bucket.

A view (the notebook's Dashboard and TraceView) sends the run to the browser as one `.ddpviz`
file, at most its bound (64 MiB, ~1.3M events). A run recorded with every hook (256 ranks x
10,000 parameters: 2.6M GradReady events a step) is far over it, yet nearly all of it is
GradReady: one event per parameter per rank per step. `summarized` replaces each rank's
GradReady events of one bucket in one step with the one GradsSummarized event that the
aggregated detail levels record at the source (the count, the bytes, the first and the last
ready time: ddpviz/recording.py's GradSummary), at the place of the bucket's last GradReady, so the
front end draws those steps as it draws a run recorded at detail "buckets" (the bucket's span
in the hook timeline, no per-parameter marks), and says so. Every other event is kept as it
was. The findings the view shows are diagnose()'s of the whole run, computed in the kernel
from every event: only the drawing is coarser.
"""

from __future__ import annotations

import itertools
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ddpviz import events as ev
from ddpviz.traces.columns import CODE, GRAD_READY, Table
from ddpviz.traces.fileformat import SUFFIX, TraceWriter
from ddpviz.traces.trace import Trace


def summarized(trace: Trace) -> tuple[Trace, int]:
    """`trace` with every (rank, step, bucket)'s GradReady events replaced by one
    GradsSummarized; and how many GradReady events were folded away (0: `trace` itself)."""
    if not has_hooks(trace):
        return trace, 0
    out = Trace(meta=dict(trace.meta), clock=dict(trace.clock))
    folded = 0
    for table, n in summarized_tables(trace):
        out.extend(table.events())
        folded += n
    return out, folded


def summarized_bytes(trace: Trace) -> tuple[bytes, int, int]:
    """`summarized(trace)` as the bytes of one `.ddpviz` file (written as `Trace.save` writes,
    from the columns, and with the payloads every rank repeats as COPY frames: See [Note: the
    COPY frame] in fileformat.py), its number of events, and how many GradReady events were
    folded away."""
    total = folded = 0

    def ranks() -> Iterator[Table]:
        nonlocal total, folded
        for table, n in summarized_tables(trace):
            total += len(table)
            folded += n
            yield table

    with tempfile.TemporaryDirectory(prefix="ddpviz-view-") as folder:
        path = Path(folder) / f"view{SUFFIX}"
        with TraceWriter(path, meta=trace.meta, copies=True, columns=True,
                         summaries=True) as w:  # (GradsSummarized in wide COLUMNS frames)
            w.write_ranks(trace.clock, ranks())
        return path.read_bytes(), total, folded


def summarized_tables(trace: Trace) -> Iterator[tuple[Table, int]]:
    """Per rank, in rank order: its columns with the GradReady rows summarized (each
    (step, bucket)'s GradsSummarized at the row of its last GradReady), and how many rows
    were folded away."""
    tables = trace.columns()
    sizes: dict[int, tuple[object, np.ndarray]] = {}  # id(params) -> (params, bytes each)
    for rank in sorted(tables):
        table = tables[rank]
        hooks = table.kind == GRAD_READY
        grads = np.flatnonzero(hooks)
        if len(grads) == 0:
            yield table, 0
            continue
        summaries = _summaries(rank, table, hooks, grads, sizes)
        kept_rows = np.flatnonzero(~hooks)
        # merged in row order: each summary at the row of its bucket's last GradReady
        order = np.argsort(np.concatenate([kept_rows, summaries.row]), kind="stable")
        yield _merged(table, kept_rows, summaries, order), \
            len(grads) - len(summaries.events)


class _Summaries(NamedTuple):
    """A rank's GradsSummarized events, and their columns (columns.py's `a`: the bucket,
    `b`: the count), with the row of each one's bucket's last GradReady."""

    row: np.ndarray
    step: np.ndarray
    t: np.ndarray
    seq: np.ndarray
    a: np.ndarray
    b: np.ndarray
    events: list[ev.GradsSummarized]


def _merged(table: Table, kept_rows: np.ndarray, summaries: _Summaries,
            order: np.ndarray) -> Table:
    """The kept rows of `table` then one row per summary, put in `order` (positions into
    that concatenation)."""
    n = len(summaries.events)
    code = np.uint8(CODE[ev.GradsSummarized])
    cols = []
    for name, extra in (("kind", np.full(n, code, dtype=np.uint8)), ("step", summaries.step),
                        ("t", summaries.t), ("seq", summaries.seq), ("a", summaries.a),
                        ("b", summaries.b), ("s", np.full(n, -1, dtype=np.int32))):
        column = getattr(table, name)
        cols.append(np.concatenate([column[kept_rows], extra.astype(column.dtype)])[order])
    new_row = np.empty(len(order), dtype=np.int64)
    new_row[order] = np.arange(len(order))
    # (every row with an object is a kept one: its place among them by bisection)
    rows = np.fromiter(table.objects, dtype=np.int64, count=len(table.objects))
    placed = new_row[np.searchsorted(kept_rows, rows)].tolist()
    objects: dict[int, ev.Event] = dict(zip(placed, table.objects.values(), strict=True))
    objects.update(zip(new_row[len(kept_rows):].tolist(), summaries.events, strict=True))
    kind, step, t, seq, a, b, s_ = cols
    return Table(table.rank, kind, step, t, seq, a, b, s_, dict(sorted(objects.items())),
                 table.strings)


def has_hooks(trace: Trace) -> bool:
    """Whether any rank of `trace` recorded a GradReady (a hook to summarize)."""
    return any(len(t.rows(ev.GradReady)) for t in trace.columns().values())


def _summaries(rank: int, table: Table, hooks: np.ndarray, grads: np.ndarray,
               known: dict[int, tuple[object, np.ndarray]]) -> _Summaries:
    """One GradsSummarized per (step, bucket) of this rank's GradReady rows (`hooks`: which
    rows they are; `grads`: their numbers; `known`: the parameter sizes of the parameter
    lists met so far, by identity)."""
    steps = table.step[hooks]
    buckets = table.b[hooks]
    times = table.t[hooks]
    params = table.a[hooks]
    sizes = _param_bytes(table, known)
    if not len(sizes):
        nbytes = np.zeros(len(grads), dtype=np.int64)
    elif int(params.min()) >= 0 and int(params.max()) < len(sizes):
        nbytes = sizes[params]  # (the usual case: every parameter in the list)
    else:
        nbytes = np.where((params >= 0) & (params < len(sizes)),
                          sizes[np.clip(params, 0, len(sizes) - 1)], 0)
    span = int(buckets.max()) + 1 if len(buckets) else 1
    key = steps * span + buckets  # (step, bucket)
    if len(key) > 1 and not bool((key[1:] >= key[:-1]).all()):
        order = np.argsort(key, kind="stable")  # (else the rows are in key order already)
        key, times, grads, nbytes = key[order], times[order], grads[order], nbytes[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    uniq = key[starts]
    first = np.minimum.reduceat(times, starts)
    last = np.maximum.reduceat(times, starts)
    last_row = np.maximum.reduceat(grads, starts)
    counts = np.diff(np.append(starts, len(key)))
    total = np.add.reduceat(nbytes, starts)
    step, bucket = uniq // span, uniq % span
    t, seq = table.t[last_row], table.seq[last_row]
    events = list(map(ev.GradsSummarized, itertools.repeat(rank, len(uniq)), step.tolist(),
                      t.tolist(), seq.tolist(), bucket.tolist(), counts.tolist(),
                      first.tolist(), last.tolist(), total.tolist()))
    return _Summaries(last_row, step, t, seq, bucket, counts, events)


def _param_bytes(table: Table, known: dict[int, tuple[object, np.ndarray]]) -> np.ndarray:
    """Bytes of each parameter's gradient (index = reducer position), from the rank's first
    ParamsBuilt; empty when it has none. Every rank of a run usually holds the same parameter
    list object (columns.py's `Shared`): computed once per list (`known`, by identity; the
    list is kept there, so its id stays its own), not 256 x 10,000 times."""
    built = table.rare(ev.ParamsBuilt)
    if not built:
        return np.zeros(0, dtype=np.int64)
    params = built[0].params
    seen = known.get(id(params))
    if seen is not None and seen[0] is params:
        return seen[1]
    out = _sizes(params)
    known[id(params)] = (params, out)
    return out


def _sizes(params: tuple[ev.ParamInfo, ...]) -> np.ndarray:
    size = max((p.index for p in params), default=-1) + 1
    out = np.zeros(size, dtype=np.int64)
    for p in params:
        out[p.index] = math.prod(p.shape) * ev.element_size_of(p)
    return out
