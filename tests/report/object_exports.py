"""The Chrome export as it was before the columnar store (one object per event, one dict per
record), kept only as the oracle test_columnar_exports.py compares
ddpviz.report.chrome_trace with."""

from __future__ import annotations

from typing import Any

from ddpviz import events as ev
from ddpviz.events import Event
from ddpviz.model.spans import SPAN_TYPES, Span, _rank_spans, event_args
from ddpviz.traces.trace import Trace


def object_spans(trace: Trace) -> list[Span]:
    out: list[Span] = []
    for rank in trace.ranks:
        events = trace.events(rank)
        out.extend(_rank_spans(rank, events, trace.clock.get(rank, (0, 0))[0],
                               events[-1].t_ns if events else 0))
    return out


_INSTANT_LANES: dict[type[Event], str] = {ev.GradReady: "gradient hooks"}
_SPAN_EVENTS = set(SPAN_TYPES)  # BackwardComputed ends a forward and stays an event


def object_chrome(trace: Trace) -> dict[str, Any]:
    spans = object_spans(trace)
    per_rank = {r: trace.events(r) for r in trace.ranks}
    starts = [s.start_ns for s in spans] + [trace.aligned_ns(lst[0])
                                            for lst in per_rank.values() if lst]
    t0 = min(starts) if starts else 0
    out: list[dict[str, Any]] = []
    tids: dict[tuple[int, str], int] = {}
    lanes: dict[int, int] = {}  # rank -> lanes so far (linear, also with 100,000 buckets)

    def tid(rank: int, lane: str) -> int:
        key = (rank, lane)
        if key not in tids:
            tids[key] = n = lanes.get(rank, 0)
            lanes[rank] = n + 1
            out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": n,
                        "args": {"name": lane}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": n,
                        "args": {"sort_index": n}})
        return tids[key]

    for rank in per_rank:
        out.append({"ph": "M", "name": "process_name", "pid": rank,
                    "args": {"name": f"rank {rank}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": rank,
                    "args": {"sort_index": rank}})
        tid(rank, "phases")
    for s in spans:
        out.append({"name": s.name, "cat": s.cat, "ph": "X", "pid": s.rank,
                    "tid": tid(s.rank, s.lane), "ts": (s.start_ns - t0) / 1000,
                    "dur": max(0, s.end_ns - s.start_ns) / 1000, "args": s.args})
    for rank, lst in per_rank.items():
        offset = trace.clock.get(rank, (0, 0))[0]
        for e in lst:
            cls = type(e)
            if cls in _SPAN_EVENTS:
                continue
            lane = _INSTANT_LANES.get(cls, "events")
            name, cat = ((f"grad p{e.param}", "hook") if isinstance(e, ev.GradReady)
                         else (cls.__name__, "event"))
            out.append({"name": name, "cat": cat,
                        "ph": "i", "s": "t", "pid": rank, "tid": tid(rank, lane),
                        "ts": (e.t_ns + offset - t0) / 1000, "args": event_args(e)})
    clock = {str(r): {"offset_ns": o, "error_ns": err} for r, (o, err) in trace.clock.items()}
    return {"traceEvents": out, "displayTimeUnit": "ms",
            "otherData": {"generator": "ddpviz", "clock": clock, "meta": trace.meta}}
