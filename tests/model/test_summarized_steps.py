"""Steps recorded per bucket only (GradsSummarized, detail "sampled"/"buckets") in the event
model and hook_analysis, on synthetic runs: the same summaries whether fed live or from a
trace's columns, cut at `as_of` like every other mark, one span per bucket with no firing order,
and at many ranks the straggler still found from the summaries. (Moved from
tests/widgets/test_summarized_steps.py when the kernel-drawn HookTimeline gave way to the TS
front end; drawing them: tests/browser/test_lab_summarized_steps.py. Issue #40.)"""

from __future__ import annotations

from ddpviz import events as ev
from ddpviz.model.event_model import EventModel
from ddpviz.model.hook_analysis import analyse
from ddpviz.model.hook_spread import iteration_spread
from ddpviz.traces.trace import Trace
from tests.widgets.streams import Plant, summarize_steps, synthetic_run


def _sums(events: list[ev.Event]) -> dict[tuple[int, int, int], tuple[int, int, int, int]]:
    return {(e.rank, e.step, e.bucket): (e.first_t_ns, e.last_t_ns, e.n_grads, e.nbytes)
            for e in events if isinstance(e, ev.GradsSummarized)}


def _model(events: list[ev.Event]) -> EventModel:
    model = EventModel()
    model.feed(events)
    return model


def test_summaries_equal_the_hooks_they_replace_fed_live_or_from_columns() -> None:
    full = synthetic_run(3, 12, 4, cap=400)
    events = summarize_steps(full, {2, 3})
    want = _sums(events)
    # the summaries are the per-bucket aggregates of the full run's hooks
    for (r, s, b), (first, last, n, _) in want.items():
        hooks = [e.t_ns for e in full if isinstance(e, ev.GradReady) and (e.rank, e.step,
                                                                          e.bucket) == (r, s, b)]
        assert (first, last, n) == (min(hooks), max(hooks), len(hooks))
    for model in (_model(events), Trace(events).model()):
        held = {(r, s, b): (x.first, x.last, x.n_grads, x.nbytes) for s in model.steps
                for r, rec in model.step_records(s).items() for b, x in rec.summaries.items()}
        assert held == want
        assert model.full_steps() == [0, 1]
    # a cut at as_of keeps the summaries emitted by then, and no later one
    ts = sorted(e.t_ns for e in events if isinstance(e, ev.GradsSummarized) and e.rank == 0
                and e.step == 2)
    assert len(ts) >= 2
    rec = _model(events).step_records(2, as_of=ts[0])[0]
    assert len(rec.summaries) == 1 and rec.summarized


def test_a_summarized_step_has_one_span_per_bucket_and_no_firing_order() -> None:
    events = summarize_steps(synthetic_run(2, 12, 4, cap=400), {3})
    model = _model(events)
    view = analyse(3, model.step_records(3), 12)
    assert view.summarized == (0, 1) and view.order.positions == {}
    want = _sums(events)
    for rank, lane in view.lanes.items():
        assert lane.order == () and lane.summarized
        spans = {b: (s.first, s.last, s.n_grads, s.nbytes)
                 for b, s in lane.record.summaries.items()}
        assert spans == {b: v for (r, s, b), v in want.items() if (r, s) == (rank, 3)}
        assert lane.compute_end == max(last for first, last, _, _ in spans.values())
    assert {b.bucket: b.n_params for b in view.buckets} == {
        b: max(n for (_, s, bb), (_, _, n, _) in want.items() if (s, bb) == (3, b))
        for (_, s, b) in want if s == 3}
    full = analyse(2, model.step_records(2), 12)  # a full step: hook by hook
    assert full.summarized == () and all(len(lane.order) == 12 for lane in full.lanes.values())


def test_a_slow_rank_among_24_is_named_from_its_summaries() -> None:
    events = summarize_steps(synthetic_run(24, 10, 3, cap=400, plant=Plant(slow={17: 400})),
                             {2})
    view = analyse(2, _model(events).step_records(2), 10)
    spread = iteration_spread(view)
    assert spread.slowest[0].rank == 17
    want = max(e.last_t_ns for e in events if isinstance(e, ev.GradsSummarized)
               and e.rank == 17 and e.step == 2)
    assert spread.slowest[0].compute_end == want - view.t0
