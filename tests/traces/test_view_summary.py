"""view_summary.summarized: a run's GradReady events folded into one GradsSummarized per (rank,
step, bucket), as the aggregated detail levels record them at the source; everything else kept
as it was, in order."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from ddpviz import events as ev
from ddpviz.model.hook_analysis import analyse
from ddpviz.traces.trace import Trace
from ddpviz.traces.view_summary import summarized
from tests.widgets.streams import synthetic_run


def test_each_buckets_hooks_become_one_summary_with_their_count_bytes_and_times() -> None:
    trace = Trace(synthetic_run(3, 40, 4, width=32))
    out, folded = summarized(trace)
    grads = trace.of_type(ev.GradReady)
    sums = out.of_type(ev.GradsSummarized)
    assert not out.of_type(ev.GradReady) and folded == len(grads) - len(sums) > 0
    sizes = {p.index: int(np.prod(p.shape)) * ev.element_size_of(p)
             for p in trace.of_type(ev.ParamsBuilt)[0].params}
    groups: dict[tuple[int, int, int], list[ev.GradReady]] = defaultdict(list)
    for g in grads:
        groups[(g.rank, g.step, g.bucket)].append(g)
    assert {(s.rank, s.step, s.bucket) for s in sums} == set(groups)
    for s in sums:
        group = groups[(s.rank, s.step, s.bucket)]
        assert s.n_grads == len(group)
        assert (s.first_t_ns, s.last_t_ns) == (min(g.t_ns for g in group),
                                               max(g.t_ns for g in group))
        assert s.nbytes == sum(sizes[g.param] for g in group)
        last = max(group, key=lambda g: g.seq)
        assert (s.t_ns, s.seq) == (last.t_ns, last.seq)


def test_every_other_event_is_kept_in_its_order_and_the_summary_sits_at_its_bucket() -> None:
    trace = Trace(synthetic_run(2, 12, 3))
    out, _ = summarized(trace)
    for rank in trace.ranks:
        before = [e for e in trace.events(rank) if not isinstance(e, ev.GradReady)]
        after = out.events(rank)
        assert [e for e in after if not isinstance(e, ev.GradsSummarized)] == before
        for i, e in enumerate(after):  # each summary comes before its bucket's BucketReady
            if isinstance(e, ev.BucketReady):
                summary = after[i - 1]
                assert isinstance(summary, ev.GradsSummarized)
                assert (summary.step, summary.bucket) == (e.step, e.bucket)
    assert Counter(map(type, out.events())) - Counter(map(type, trace.events())) == Counter(
        {ev.GradsSummarized: len(out.of_type(ev.GradsSummarized))})
    assert out.meta == trace.meta and out.clock == trace.clock


def test_the_hook_timeline_of_a_summarized_step_keeps_each_buckets_span() -> None:
    trace = Trace(synthetic_run(2, 12, 3))
    out, _ = summarized(trace)
    full, coarse = trace.model(), out.model()
    for step in full.steps:
        a = analyse(step, full.step_records(step), 12)
        b = analyse(step, coarse.step_records(step), 12)
        assert [(x.bucket, x.nbytes, x.allreduce_ms) for x in a.buckets] == \
            [(x.bucket, x.nbytes, x.allreduce_ms) for x in b.buckets]


def test_a_run_without_hooks_is_returned_as_it_is() -> None:
    trace = Trace([e for e in synthetic_run(2, 6, 2) if not isinstance(e, ev.GradReady)])
    out, folded = summarized(trace)
    assert out is trace and folded == 0
