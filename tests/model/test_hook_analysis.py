"""One iteration's hooks and all-reduces across ranks (ddpviz/model/hook_analysis.py, the data
the hook timeline draws; hook_spread.py above 16 ranks): firing order per rank with the
positions that depart from the reference, all-reduce spans with their exposed part, unused
parameters by rank, the slowest ranks and per-bucket spreads at 256 ranks, and a NaN origin's
rank and parameter, all checked against the planted events that produced them. (Moved from
tests/widgets/test_hook_timeline.py when the kernel-drawn HookTimeline gave way to the TS
front end, extension/src/hookTimeline.ts: issue #40.)"""

from __future__ import annotations

from ddpviz import events as ev
from ddpviz.findings import Finding
from ddpviz.model.event_model import EventModel
from ddpviz.model.hook_analysis import IterationView, analyse, order_diff
from ddpviz.model.hook_spread import iteration_spread
from ddpviz.model.rank_groups import percentile, value_groups
from tests.widgets.streams import Plant, synthetic_run


def iteration(events: list[ev.Event], step: int, n_params: int | None = None
              ) -> tuple[EventModel, IterationView]:
    model = EventModel()
    model.feed(events)
    return model, analyse(step, model.step_records(step), n_params)


def test_a_swapped_hook_order_on_one_rank_departs_at_those_positions() -> None:
    events = synthetic_run(3, 8, 3, plant=Plant(swap={2: (1, 2, 5)}))
    model, view = iteration(events, 1, 8)
    order = view.order
    assert order.reference_ranks == (0, 1)
    assert order.positions == {0: (), 1: (), 2: (2, 5)}  # exactly the two swapped positions
    assert order.departures == {0: 0, 1: 0, 2: 2}
    fired = [e.param for e in events if isinstance(e, ev.GradReady) and e.rank == 2
             and e.step == 1]
    assert view.lanes[2].order == tuple(fired)
    later = analyse(2, model.step_records(2), 8)  # the swap was planted in iteration 1 only
    assert not later.order.differs and len(later.order.reference) == 8
    assert later.order.reference_ranks == (0, 1, 2)


def test_exposed_communication_is_what_runs_after_the_last_hook() -> None:
    events = synthetic_run(2, 8, 2, allreduce_us=2000)
    _, view = iteration(events, 1)
    for rank, lane in view.lanes.items():
        mine = [e for e in events if e.rank == rank and e.step == 1]
        last_hook = max(e.t_ns for e in mine if isinstance(e, ev.GradReady))
        launched = {e.bucket: e.t_ns for e in mine if isinstance(e, ev.AllReduceLaunched)}
        done = {e.bucket: e.t_ns for e in mine if isinstance(e, ev.AllReduceDone)}
        assert [s.bucket for s in lane.allreduce] == sorted(launched)
        for span in lane.allreduce:
            expected = max(0, done[span.bucket] - max(launched[span.bucket], last_hook))
            assert (span.start, span.end, span.exposed_ns) == (
                launched[span.bucket], done[span.bucket], expected)
        assert lane.exposed_ns == max(done.values()) - last_hook > 0
    for b in view.buckets:  # per bucket: the worst rank's exposed time
        per_rank = [s.exposed_ns / 1e6 for lane in view.lanes.values()
                    for s in lane.allreduce if s.bucket == b.bucket]
        assert b.exposed_ms == max(per_rank)


def test_unused_parameters_are_listed_by_rank() -> None:
    events = synthetic_run(2, 6, 2, plant=Plant(unused={0: (0, 1)}))
    model, view = iteration(events, 1, 6)
    assert view.unused == {0: (0, 1)}
    built = next(s.params.event for s in model.construction().values()
                 if s.params is not None and isinstance(s.params.event, ev.ParamsBuilt))
    assert {p.index: p.name for p in built.params if p.index in (0, 1)} == {
        0: "0.weight", 1: "0.bias"}


def test_every_departure_is_kept_when_the_model_is_large() -> None:
    events = synthetic_run(2, 300, 1, plant=Plant(swap={1: (0, 150, 151)}))
    _, view = iteration(events, 0, 300)
    assert view.order.positions == {0: (), 1: (150, 151)}


def test_ranks_still_in_backward_are_compared_on_what_they_fired() -> None:
    assert order_diff({0: (5, 4, 3, 2), 1: (5, 4), 2: (5, 4, 3, 2)}).positions == {
        0: (), 1: (2, 3), 2: ()}
    events = synthetic_run(2, 6, 1)
    m = EventModel()
    m.feed(events)
    third = [e for e in events if isinstance(e, ev.GradReady) and e.rank == 1][2]
    view = analyse(0, m.step_records(0, as_of=third.t_ns), 6)
    assert view.lanes[1].order == (5, 4, 3) and view.lanes[1].unused == ()


def test_at_256_ranks_the_slowest_ranks_and_the_bucket_spreads_come_from_the_events() -> None:
    """Ranks 37 and 200 take longer per hook; ranks start 7 us apart (the stream's clock
    offsets), so without the planted slowness the highest ranks finish last."""
    events = synthetic_run(256, 12, 2, plant=Plant(slow={37: 300, 200: 200},
                                                   swap={9: (1, 2, 5), 10: (1, 2, 5)}))
    _, view = iteration(events, 1, 12)
    spread = iteration_spread(view)
    assert len(view.lanes) == 256 and spread.n_ranks == 256
    # the slowest ranks are the ones whose last hook was latest, computed from the events
    last = {r: max(e.t_ns for e in events if isinstance(e, ev.GradReady) and e.rank == r
                   and e.step == 1) for r in range(256)}
    expected = sorted(last, key=lambda r: (-last[r], r))[:5]
    assert [s.rank for s in spread.slowest] == expected
    assert expected[:2] == [37, 200] and spread.slowest[0].behind_ms > 0
    # per bucket: the spread of ready times over ranks, from BucketReady
    for b in spread.buckets:
        ready = sorted(e.t_ns - view.t0 for e in events if isinstance(e, ev.BucketReady)
                       and e.step == 1 and e.bucket == b.bucket)
        assert b.ready is not None and b.ready.n == 256
        assert b.ready.p50 == percentile(ready, 50)
        assert (b.ready.min, b.ready.max) == (ready[0], ready[-1])
    # firing orders grouped: the 254 agreeing ranks in one group, ranks 9 and 10 in another
    groups = value_groups({r: lane.order for r, lane in view.lanes.items()})
    assert [g.label for g in groups] == ["0-8, 11-255", "9, 10"]
    assert {r for r, p in view.order.positions.items() if p} == {9, 10}


def test_up_to_16_ranks_every_rank_has_its_lane() -> None:
    _, view = iteration(synthetic_run(16, 6, 2), 1)
    assert sorted(view.lanes) == list(range(16))
    assert all(len(lane.order) == 6 for lane in view.lanes.values())


def test_a_nan_origin_names_its_rank_and_parameter_in_that_iteration_only() -> None:
    events = synthetic_run(3, 6, 3)
    mine = [e for e in events if e.rank == 1 and e.step == 1]
    param = next(e.param for e in mine if isinstance(e, ev.GradReady))
    finding = Finding(kind="nonfinite_gradient", severity="warning",
                      title=f"non-finite local gradient 'p{param}' on rank 1 at step 1",
                      ranks=(1,), param=param, step=1, world_size=3,
                      values=(("loss finite, local gradients finite", (0, 2)),
                              (f"loss finite, local gradient non-finite: 'p{param}'", (1,))))
    events.append(ev.FindingReported(1, 1, max(e.t_ns for e in mine) + 1, 10**6, finding))
    model, view = iteration(events, 1, 6)
    nan = [f for f in model.findings() if isinstance(f, Finding)
           and f.kind == "nonfinite_gradient"]
    assert [(f.step, f.ranks, f.param) for f in nan] == [(1, (1,), param)]
    assert param in view.lanes[1].order  # the mark's position in rank 1's firing order
    assert nan[0].values[1] == (f"loss finite, local gradient non-finite: 'p{param}'", (1,))
    assert [f for f in nan if f.step == 2] == []  # only the iteration where it began
