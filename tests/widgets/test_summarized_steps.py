"""Steps recorded per bucket only (GradsSummarized, detail "sampled"/"buckets") in the event
model and the hook timeline, on synthetic runs: the same summaries whether fed live or from a
trace's columns, cut at `as_of` like every other mark, drawn as one span per bucket with a
note, and at many ranks (distributions) the straggler still found from the summaries."""

from __future__ import annotations

import html

from ddpviz import events as ev
from ddpviz.model.event_model import EventModel
from ddpviz.traces.trace import Trace
from ddpviz.widgets import HookTimeline
from ddpviz.widgets.hook_timeline import step_list
from tests.widgets.streams import Plant, summarize_steps, synthetic_run


def _sums(events: list[ev.Event]) -> dict[tuple[int, int, int], tuple[int, int, int, int]]:
    return {(e.rank, e.step, e.bucket): (e.first_t_ns, e.last_t_ns, e.n_grads, e.nbytes)
            for e in events if isinstance(e, ev.GradsSummarized)}


def test_summaries_equal_the_hooks_they_replace_fed_live_or_from_columns() -> None:
    full = synthetic_run(3, 12, 4, cap=400)
    events = summarize_steps(full, {2, 3})
    want = _sums(events)
    # the summaries are the per-bucket aggregates of the full run's hooks
    for (r, s, b), (first, last, n, _) in want.items():
        hooks = [e.t_ns for e in full if isinstance(e, ev.GradReady) and (e.rank, e.step,
                                                                          e.bucket) == (r, s, b)]
        assert (first, last, n) == (min(hooks), max(hooks), len(hooks))
    live, cols = EventModel(), EventModel()
    live.feed(events)
    for table in Trace(events).columns().values():
        cols.feed_table(table)
    for model in (live, cols):
        held = {(r, s, b): (x.first, x.last, x.n_grads, x.nbytes) for s in model.steps
                for r, rec in model.step_records(s).items() for b, x in rec.summaries.items()}
        assert held == want
        assert model.full_steps() == [0, 1]
    # a cut at as_of keeps the summaries emitted by then, and no later one
    ts = sorted(e.t_ns for e in events if isinstance(e, ev.GradsSummarized) and e.rank == 0
                and e.step == 2)
    assert len(ts) >= 2
    rec = live.step_records(2, as_of=ts[0])[0]
    assert len(rec.summaries) == 1 and rec.summarized


def test_the_timeline_of_a_summarized_step_draws_buckets_and_says_so() -> None:
    events = summarize_steps(synthetic_run(2, 12, 4, cap=400), {3})
    t = HookTimeline(events)
    assert t.controls is not None
    t.controls.show_step(3)
    assert t.view is not None and t.view.summarized == (0, 1)
    n_summaries = sum(1 for e in events if isinstance(e, ev.GradsSummarized))
    assert t.svg_html.value.count("class='ddpviz-grad-summary'") == n_summaries
    assert "step 3: per-bucket summaries; per-parameter hooks recorded on steps 0-2 " \
        "(Recording(every=1): every step)" in html.unescape(t.header_html.value)
    assert "not recorded" in t.order_html.value
    t.controls.show_step(2)
    assert "ddpviz-grad-summary" not in t.svg_html.value
    assert "not recorded" not in t.order_html.value


def test_a_slow_rank_among_24_is_named_from_its_summaries() -> None:
    events = summarize_steps(synthetic_run(24, 10, 3, cap=400, plant=Plant(slow={17: 400})),
                             {2})
    t = HookTimeline(events)
    assert t.controls is not None
    t.controls.show_step(2)
    assert t.spread is not None and t.view is not None
    assert t.spread.slowest[0].rank == 17
    want = max(e.last_t_ns for e in events if isinstance(e, ev.GradsSummarized)
               and e.rank == 17 and e.step == 2)
    assert t.spread.slowest[0].compute_end == want - t.view.t0
    assert t.shown_ranks() == [17]
    assert "class='ddpviz-grad-summary'" in t.svg_html.value  # the drawn lane: bucket spans


def test_step_list_folds_runs() -> None:
    assert step_list([0, 1, 2, 100, 200]) == "0-2, 100, 200"
    assert step_list([5]) == "5"
    assert step_list(list(range(0, 1000, 100)), most=3) == "0, 100, 200, ..."
