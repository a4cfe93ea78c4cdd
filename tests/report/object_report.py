"""What the static report reads from the columns, computed from events as objects (the way the
report did before the columnar store), kept only as the oracle test_columnar_exports.py compares
ddpviz.report with: the per-rank counts, the backward marks the timelines draw and the bucket
maps (the spans have their own oracle in object_exports.py; the findings and the summary are
diagnose()'s and verdict.py's, tested on their own)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ddpviz import events as ev
from ddpviz.report.ranks import RankCounts
from ddpviz.report.timeline import Computed
from ddpviz.traces.trace import Trace


def rank_counts(trace: Trace) -> dict[int, RankCounts]:
    out: dict[int, RankCounts] = {}
    for rank in trace.ranks:
        evs = trace.events(rank)
        seqs = {e.seq for e in evs if type(e) is not ev.EventsDropped}
        holes = (max(seqs) + 1 - len(seqs)) if seqs else 0
        dropped = sum(e.count for e in evs if isinstance(e, ev.EventsDropped))
        steps = max((e.step for e in evs), default=-1) + 1
        in_steps = [e.t_ns for e in evs if e.step >= 0]
        span = max(e.t_ns for e in evs) - min(in_steps) if in_steps else 0
        out[rank] = RankCounts(len(evs), steps, span, dropped, holes)
    return out


def computed_marks(trace: Trace) -> list[Computed]:
    out: list[Computed] = []
    for rank in trace.ranks:
        off = trace.clock.get(rank, (0, 0))[0]
        out += [Computed(rank, e.step, e.first_t_ns + off, e.t_ns + off)
                for e in trace.events(rank) if isinstance(e, ev.BackwardComputed)]
    return out


def bucket_maps(trace: Trace) -> dict[tuple[Any, ...], list[tuple[int, int]]]:
    maps: dict[tuple[Any, ...], list[tuple[int, int]]] = defaultdict(list)
    for e in trace:
        if isinstance(e, ev.BucketAssigned):
            maps[(e.rebuilt, e.buckets, e.limits)].append((e.rank, e.step))
    return maps
