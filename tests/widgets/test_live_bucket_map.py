"""LiveBucketMap: the BucketMap shows exactly the maps the BucketAssigned events carried, the
one in force at the cursor's iteration, with per-bucket timing from the all-reduce events."""

from __future__ import annotations

import msgspec

from ddpviz import events as ev
from ddpviz.plan import NOT_RECORDED, infer_settings, observed_plan
from ddpviz.widgets import LiveBucketMap
from ddpviz.widgets.bucket_figure import bar_traces
from ddpviz.widgets.bucket_segments import bucket_label, limit_markers
from tests.widgets.streams import MAXSIZE, synthetic_run


def assigned(events: list[ev.Event], rank: int = 0) -> list[ev.BucketAssigned]:
    return [e for e in events if isinstance(e, ev.BucketAssigned) and e.rank == rank]


def test_the_maps_shown_are_the_maps_the_events_carried() -> None:
    events = synthetic_run(2, 8, 3, cap=int(0.001 * 2**20))  # what bucket_cap_mb=0.001 gives
    m = LiveBucketMap(events)
    initial, rebuilt = assigned(events)
    assert m.observed is not None and m.bucket_map is not None
    plan = m.observed.plan
    assert plan.bucket_indices("initial") == [list(b) for b in initial.buckets]
    assert plan.bucket_indices("rebuilt") == [list(b) for b in rebuilt.buckets]
    assert [b.limit for b in plan.rebuilt or ()] == list(rebuilt.limits)
    assert m.observed.rebuilt_step == 1 and plan.settings.bucket_cap_mb == 0.001
    assert m.which == "rebuilt" and m.bucket_map.which == "rebuilt"  # the last iteration's
    segments = sum(len(t.x) for t in bar_traces(m.bucket_map.figure))
    assert segments == 8  # one bar per parameter
    assert "rebuilt map observed on rank 0 (iteration 1 on)" in plan.notes
    assert m.controls is not None
    m.controls.show_step(0)
    assert m.which == "initial" and m.bucket_map.which == "initial"
    assert "map in force at iteration 0: <b>initial</b>" in m.header_html.value


def test_before_the_rebuild_the_rebuilt_map_is_predicted_and_labelled_so() -> None:
    events = [e for e in synthetic_run(2, 8, 3, cap=1100) if e.step <= 0]
    m = LiveBucketMap(events)
    assert m.observed is not None and m.observed.rebuilt_step is None
    plan = m.observed.plan
    assert plan.rebuilt is not None  # torch will rebuild (find_unused_parameters=False)
    assert plan.order_source == "measured"  # iteration 0's hooks give the order
    assert "rebuilt map predicted by the planner: not rebuilt yet in this run" in plan.notes


def test_per_bucket_timing_averages_the_iterations_of_the_map_shown() -> None:
    events = synthetic_run(2, 8, 4, cap=1100, allreduce_us=900)
    m = LiveBucketMap(events)
    assert m.which == "rebuilt"
    durations: dict[int, list[float]] = {}
    for step in (1, 2, 3):
        for b in range(len(assigned(events)[1].buckets)):
            per_rank = []
            for r in (0, 1):
                mine = [e for e in events if e.rank == r and e.step == step]
                start = next(e.t_ns for e in mine if isinstance(e, ev.AllReduceLaunched)
                             and e.bucket == b)
                end = next(e.t_ns for e in mine if isinstance(e, ev.AllReduceDone)
                           and e.bucket == b)
                per_rank.append((end - start) / 1e6)
            durations.setdefault(b, []).append(max(per_rank))
    assert [t.bucket for t in m.timing] == sorted(durations)
    for t in m.timing:
        assert t.iterations == 3
        assert t.allreduce_ms is not None
        assert abs(t.allreduce_ms - sum(durations[t.bucket]) / 3) < 1e-9


def test_settings_are_inferred_from_the_limits() -> None:
    one = ev.BucketAssigned(0, -1, 0, 0, ((0, 1),), (MAXSIZE,), False)
    default = ev.BucketAssigned(0, 1, 0, 0, ((1,), (0,)), (1 << 20, 25 << 20), True)
    assert infer_settings(one, default, 1).bucket_cap_mb is None
    capped = ev.BucketAssigned(0, 2, 0, 0, ((1,), (0,)), (5 << 20, 5 << 20), True)
    s = infer_settings(one, capped, 2)
    assert s.bucket_cap_mb == 5 and s.static_graph  # rebuilt before the 3rd forward
    unused = ev.BucketAssigned(0, -1, 0, 0, ((1,), (0,)), (1 << 20, 25 << 20), False)
    s = infer_settings(unused, None, None)
    assert s.find_unused_parameters and s.bucket_cap_mb is None


def test_a_rank_whose_maps_differ_is_named() -> None:
    events = synthetic_run(2, 8, 2, cap=1100)
    swapped = []
    for e in events:
        if isinstance(e, ev.BucketAssigned) and e.rank == 1 and e.rebuilt:
            e = ev.BucketAssigned(1, e.step, e.t_ns, e.seq, tuple(reversed(e.buckets)),
                                  e.limits, True)
        swapped.append(e)
    m = LiveBucketMap(swapped)
    assert m.observed is not None
    assert m.observed.disagreements == ("rank 1's bucket map differs from rank 0's",)
    assert "✘ rank 1&#x27;s bucket map differs" in m.header_html.value


def test_nothing_is_drawn_before_the_constructors_map() -> None:
    events = [e for e in synthetic_run(2, 4, 1) if not isinstance(e, ev.BucketAssigned)
              and e.step < 0]
    m = LiveBucketMap(events)
    assert m.bucket_map is None and m.map_box.children == ()
    assert "waiting for the constructor's BucketAssigned" in m.header_html.value


def test_observed_plan_needs_the_constructors_map() -> None:
    built = next(e for e in synthetic_run(1, 2, 0) if isinstance(e, ev.ParamsBuilt))
    try:
        observed_plan(built, [])
    except ValueError as e:
        assert str(e).startswith("ddpviz: rank 0 reported no constructor BucketAssigned")
    else:
        raise AssertionError("observed_plan accepted no maps")


def test_maps_recorded_without_caps_are_drawn_with_the_caps_said_not_recorded() -> None:
    # watch() records no caps where it cannot tell torch's (a learned map, a replay that
    # differs): the maps are drawn, each bucket's cap "not recorded", no limit marker
    events = [msgspec.structs.replace(e, limits=()) if isinstance(e, ev.BucketAssigned) else e
              for e in synthetic_run(2, 8, 3, cap=1100)]
    m = LiveBucketMap(events)
    assert m.plan_error is None and m.observed is not None and m.bucket_map is not None
    plan = m.observed.plan
    assert plan.rebuilt is not None and len(plan.rebuilt) > 1
    assert {b.limit for b in (*plan.initial, *plan.rebuilt)} == {NOT_RECORDED}
    assert all(bucket_label(b).endswith("cap not recorded") for b in plan.rebuilt)
    assert limit_markers(plan.rebuilt) == []
    assert "not recorded" in str(plan) and "-1 B" not in str(plan)  # print(plan)
