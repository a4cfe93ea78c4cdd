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

import math
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ddpviz import events as ev
from ddpviz.traces.columns import Table
from ddpviz.traces.fileformat import SUFFIX, TraceWriter
from ddpviz.traces.trace import Trace


def summarized(trace: Trace) -> tuple[Trace, int]:
    """`trace` with every (rank, step, bucket)'s GradReady events replaced by one
    GradsSummarized; and how many GradReady events were folded away (0: `trace` itself)."""
    if not has_hooks(trace):
        return trace, 0
    out = Trace(meta=dict(trace.meta), clock=dict(trace.clock))
    folded = 0
    for _, events, n in summarized_ranks(trace):
        out.extend(events)
        folded += n
    return out, folded


def summarized_bytes(trace: Trace) -> tuple[bytes, int, int]:
    """`summarized(trace)` as the bytes of one `.ddpviz` file (written as `Trace.save` writes,
    without building the summarized Trace first, and with the payloads every rank repeats as
    COPY frames: See [Note: the COPY frame] in fileformat.py), its number of events, and how
    many GradReady events were folded away."""
    total = folded = 0

    def ranks() -> Iterator[list[ev.Event]]:
        nonlocal total, folded
        for _, events, n in summarized_ranks(trace):
            total += len(events)
            folded += n
            yield events

    with tempfile.TemporaryDirectory(prefix="ddpviz-view-") as folder:
        path = Path(folder) / f"view{SUFFIX}"
        with TraceWriter(path, meta=trace.meta, copies=True) as w:
            w.write_ranks(trace.clock, ranks())
        return path.read_bytes(), total, folded


def summarized_ranks(trace: Trace) -> Iterator[tuple[int, list[ev.Event], int]]:
    """Per rank: its events with the GradReady ones summarized, and how many were folded."""
    tables = trace.columns()
    sizes: dict[int, tuple[object, np.ndarray]] = {}  # id(params) -> (params, bytes each)
    for rank in sorted(tables):
        table = tables[rank]
        grads = table.rows(ev.GradReady)
        if len(grads) == 0:
            yield rank, table.events(), 0
            continue
        summaries = _summaries(rank, table, grads, sizes)
        keep = np.ones(len(table), dtype=bool)
        keep[grads] = False
        kept_rows = np.flatnonzero(keep)
        kept = table.events(kept_rows)
        # merged in row order: each summary at the row of its bucket's last GradReady
        at = np.array([row for row, _ in summaries], dtype=np.int64)
        order = np.argsort(np.concatenate([kept_rows, at]), kind="stable")
        both: list[ev.Event] = kept + [e for _, e in summaries]
        yield rank, [both[i] for i in order.tolist()], len(grads) - len(summaries)


def has_hooks(trace: Trace) -> bool:
    """Whether any rank of `trace` recorded a GradReady (a hook to summarize)."""
    return any(len(t.rows(ev.GradReady)) for t in trace.columns().values())


def _summaries(rank: int, table: Table, grads: np.ndarray,
               known: dict[int, tuple[object, np.ndarray]]) -> list[tuple[int, ev.Event]]:
    """One (row, GradsSummarized) per (step, bucket) of this rank's GradReady rows (`known`:
    the parameter sizes of the parameter lists met so far, by identity)."""
    steps = table.step[grads]
    buckets = table.b[grads]
    times = table.t[grads]
    params = table.a[grads]
    sizes = _param_bytes(table, known)
    nbytes = np.where((params >= 0) & (params < len(sizes)),
                      sizes[np.clip(params, 0, max(len(sizes) - 1, 0))], 0) \
        if len(sizes) else np.zeros(len(grads), dtype=np.int64)
    span = int(buckets.max()) + 1 if len(buckets) else 1
    uniq, inverse = np.unique(steps * span + buckets, return_inverse=True)  # (step, bucket)
    inverse = inverse.reshape(-1)
    n = len(uniq)
    uniq_step, uniq_bucket = uniq // span, uniq % span
    first = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    last = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    np.minimum.at(first, inverse, times)
    np.maximum.at(last, inverse, times)
    counts = np.bincount(inverse, minlength=n)
    total = np.bincount(inverse, weights=nbytes, minlength=n).astype(np.int64)
    last_row = np.zeros(n, dtype=np.int64)
    np.maximum.at(last_row, inverse, grads)
    seq = table.seq[last_row]
    t_at = table.t[last_row]
    return [(int(last_row[i]), ev.GradsSummarized(
        rank=rank, step=int(uniq_step[i]), t_ns=int(t_at[i]), seq=int(seq[i]),
        bucket=int(uniq_bucket[i]), n_grads=int(counts[i]), first_t_ns=int(first[i]),
        last_t_ns=int(last[i]), nbytes=int(total[i]))) for i in range(n)]


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
