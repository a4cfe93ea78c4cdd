"""The advisor reads the run model's step records: a trace, the model of a trace, and a model
fed event by event (a live session's way) give the same timeline and advice."""

from __future__ import annotations

from ddpviz import events as ev
from ddpviz.advisor import advise, build_timeline
from ddpviz.model.event_model import EventModel
from ddpviz.traces.trace import Trace
from tests.advise.synthetic import linear_stack, run_trace


def _trace() -> Trace:
    return run_trace(linear_stack(12, 64), bucket_cap_mb=0.04, latency_s=2e-4,
                     seconds_per_byte=1e-9, steps=5, done_at_finalize=True)


def test_a_model_fed_event_by_event_gives_the_trace_s_timeline_and_advice() -> None:
    trace = _trace()
    live = EventModel(trace.clock)
    for rank in trace.ranks:
        live.feed(trace.events(rank))
    a, b = build_timeline(trace), build_timeline(live)
    assert not a.notes and a.finalize_ns > 0  # launch and finalize gaps were found
    assert (a.launch_overhead_ns, a.finalize_ns, a.done_seen_at_finalize) == \
        (b.launch_overhead_ns, b.finalize_ns, b.done_seen_at_finalize)
    assert a.records == b.records and a.buckets == b.buckets
    assert a.steady_steps() == b.steady_steps() == [1, 2, 3]
    by_trace, by_model = advise(trace), advise(trace.model())
    assert [r.prediction for r in by_trace.rows] == [r.prediction for r in by_model.rows]


def test_an_evaluation_forward_after_the_backward_leaves_its_step_out() -> None:
    events = list(_trace())
    ends = {(e.rank, e.step): i for i, e in enumerate(events)
            if isinstance(e, ev.BackwardFinished)}
    evaluated = []
    for i, e in enumerate(events):  # ranks' events renumbered after the inserted forward
        evaluated.append(e)
        if ends.get((e.rank, 2)) == i:
            evaluated.append(ev.ForwardStarted(e.rank, 2, e.t_ns + 10, e.seq))
    fixed = [type(e)(**{**{f: getattr(e, f) for f in e.__struct_fields__}, "seq": n})
             for n, e in enumerate(sorted(evaluated, key=lambda e: (e.rank, e.t_ns)))]
    timeline = build_timeline(Trace(fixed))
    assert timeline.steady_steps() == [1, 3]
    assert not timeline.complete(2, 0) and timeline.complete(1, 0)
