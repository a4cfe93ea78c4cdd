"""Spans: a rank's events as intervals on the aligned clock (phases, all-reduces, broadcast
chunks, per-bucket gradient summaries), the shape the report's timeline and the Chrome/Perfetto
export draw. Built from a rank's columns: only the events that open or close a span become
objects.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import msgspec

from ddpviz import events as ev
from ddpviz.events import Event
from ddpviz.model.phases import SPAN_CLOSES, SPAN_OPENS, SpanPhase
from ddpviz.traces.columns import Table

SpanCategory = Literal["phase", "allreduce", "broadcast", "gradients"]
SUMMARY_LANE = "gradients ready (per-bucket summaries)"


class Span(NamedTuple):
    """An interval on one rank, on the aligned clock (see Trace.aligned_ns)."""

    rank: int
    name: str  # "backward", "all-reduce b3", "broadcast chunk 0", ...
    cat: SpanCategory
    lane: str  # which row it is drawn in: "phases", "all-reduce bucket 3", ...
    step: int
    start_ns: int
    end_ns: int
    finished: bool  # False: no end event (the rank crashed or hung inside it)
    args: dict[str, Any]


def event_args(event: Event) -> dict[str, Any]:
    """An event's fields as plain values, without the ones every event has (the span and Chrome
    exports' "args")."""
    d: dict[str, Any] = msgspec.to_builtins(event)
    for k in ("type", "rank", "t_ns"):
        d.pop(k, None)
    return d


class _RankSpans:
    """The spans of one rank's events: one handler per event type that opens or closes a span
    (`_SPAN_HANDLERS`), each typed with its event class."""

    def __init__(self, rank: int, offset: int) -> None:
        self.rank, self.offset = rank, offset
        self.out: list[Span] = []
        self.open_phase: dict[SpanPhase, Event] = {}  # by the phase it opened
        self.open_ar: dict[int, list[ev.AllReduceLaunched]] = {}
        self.open_chunk: dict[int, list[ev.BroadcastChunkSent]] = {}

    def close(self, start: Event, end_ns: int, name: str, cat: SpanCategory, lane: str,
              done: bool, extra: dict[str, Any]) -> None:
        args = event_args(start)
        args.update(extra)
        if not done:
            args["unfinished"] = True
        self.out.append(Span(self.rank, name, cat, lane, start.step, start.t_ns + self.offset,
                             end_ns + self.offset, done, args))

    def phase(self, e: Event) -> None:
        cls = type(e)
        ended = SPAN_CLOSES.get(cls)
        if ended is not None and ended in self.open_phase:
            s = self.open_phase.pop(ended)
            self.close(s, e.t_ns, ended, "phase", "phases", True, {"ended_by": cls.__name__})
        opened = SPAN_OPENS.get(cls)
        if opened is not None:
            self.open_phase[opened] = e

    def backward_computed(self, e: ev.BackwardComputed) -> None:
        """A step recorded without BackwardStarted (hook-less watch(), unsampled): its forward
        ended before its first gradient (`first_t_ns`), so the forward span ends there, not at
        the next forward (the last step's would never end, and read as unfinished)."""
        s = self.open_phase.get("forward")
        if s is not None and s.step == e.step:
            del self.open_phase["forward"]
            end = e.first_t_ns if s.t_ns <= e.first_t_ns <= e.t_ns else e.t_ns
            self.close(s, end, "forward", "phase", "phases", True,
                       {"ended_by": "BackwardComputed (its first gradient)"})

    def allreduce_launched(self, e: ev.AllReduceLaunched) -> None:
        self.open_ar.setdefault(e.bucket, []).append(e)

    def allreduce_done(self, e: ev.AllReduceDone) -> None:
        pending = self.open_ar.get(e.bucket)
        if pending:
            s = pending.pop(0)
            b = e.bucket
            self.close(s, e.t_ns, f"all-reduce b{b}", "allreduce", f"all-reduce bucket {b}",
                       True, {})

    def grads_summarized(self, e: ev.GradsSummarized) -> None:
        """An aggregated step (detail "buckets"/"sampled"): the bucket's gradients were ready
        from its first to its last hook; per-parameter hooks were not recorded."""
        args = event_args(e)
        args["per_parameter"] = "not recorded (detail level aggregated this step)"
        self.out.append(Span(self.rank, f"gradients ready b{e.bucket} (summary of {e.n_grads})",
                             "gradients", SUMMARY_LANE, e.step, e.first_t_ns + self.offset,
                             e.last_t_ns + self.offset, True, args))

    def chunk_sent(self, e: ev.BroadcastChunkSent) -> None:
        self.open_chunk.setdefault(e.chunk, []).append(e)

    def chunk_done(self, e: ev.BroadcastChunkDone) -> None:
        pending = self.open_chunk.get(e.chunk)
        if pending:
            s = pending.pop(0)
            self.close(s, e.t_ns, f"broadcast chunk {e.chunk}", "broadcast", "", True, {})

    def finish(self, last: int) -> list[Span]:
        """Close what is still open at `last` (unfinished), then lay out broadcast lanes."""
        for phase, s in self.open_phase.items():
            self.close(s, last, phase, "phase", "phases", False, {})
        for pending in self.open_ar.values():
            for a in pending:
                b = a.bucket
                self.close(a, last, f"all-reduce b{b}", "allreduce", f"all-reduce bucket {b}",
                           False, {})
        for chunks in self.open_chunk.values():
            for c in chunks:
                self.close(c, last, f"broadcast chunk {c.chunk}", "broadcast", "", False, {})
        # Broadcast chunks overlap (2 in flight): give each the first lane free at its start.
        chunk_lanes: list[int] = []  # end time of the last span in each broadcast lane
        result: list[Span] = []
        for sp in sorted(self.out, key=lambda s: s.start_ns):
            if sp.cat == "broadcast":
                lane = next((i for i, t in enumerate(chunk_lanes) if t <= sp.start_ns), None)
                if lane is None:
                    lane = len(chunk_lanes)
                    chunk_lanes.append(sp.end_ns)
                chunk_lanes[lane] = sp.end_ns
                sp = sp._replace(lane=f"broadcast lane {lane}")
            result.append(sp)
        return result


# Event type -> the _RankSpans handler it goes to (the others open or close no span).
_SPAN_HANDLERS: dict[type[Event], Any] = {
    **dict.fromkeys((*SPAN_OPENS, *SPAN_CLOSES), _RankSpans.phase),
    ev.AllReduceLaunched: _RankSpans.allreduce_launched,
    ev.AllReduceDone: _RankSpans.allreduce_done,
    ev.BroadcastChunkSent: _RankSpans.chunk_sent,
    ev.BroadcastChunkDone: _RankSpans.chunk_done,
    ev.GradsSummarized: _RankSpans.grads_summarized,
    ev.BackwardComputed: _RankSpans.backward_computed,
}


def _rank_spans(rank: int, events: list[Event], offset: int, last: int) -> list[Span]:
    spans = _RankSpans(rank, offset)
    for e in events:
        handler = _SPAN_HANDLERS.get(type(e))
        if handler is not None:
            handler(spans, e)
    return spans.finish(last)


def table_spans(table: Table, offset: int) -> list[Span]:
    """The spans of one rank's columns: only the events that open or close one are built."""
    events = table.events(table.rows(*_SPAN_HANDLERS))
    return _rank_spans(table.rank, events, offset, int(table.t[-1]) if len(table) else 0)


# the event types that are drawn only as spans (BackwardComputed, which may also end a
# forward, stays an event of its own in the exports)
SPAN_TYPES = tuple(t for t in _SPAN_HANDLERS if t is not ev.BackwardComputed)
