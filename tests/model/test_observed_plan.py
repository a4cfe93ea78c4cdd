"""The bucket maps a run really used (`ddpviz.plan.observed_plan` of the EventModel's
BucketAssigned events, what the dashboard's bucket map shows): exactly the maps the events
carried, the one in force at an iteration, per-bucket timing averaged over the iterations that
used it, settings inferred from the limits, and the maps per rank where ranks disagree.
(Moved from tests/widgets/test_live_bucket_map.py when the kernel-drawn LiveBucketMap gave way
to the TS front end: issue #40.)"""

from __future__ import annotations

import msgspec

from ddpviz import events as ev
from ddpviz.model.event_model import CONSTRUCTION, EventModel
from ddpviz.model.hook_analysis import BucketAverages, bucket_averages, hook_columns
from ddpviz.plan import NOT_RECORDED, ObservedMaps, infer_settings, observed_plan
from ddpviz.widgets.bucket_figure import bar_traces
from ddpviz.widgets.bucket_map import BucketMap, Which
from ddpviz.widgets.bucket_segments import bucket_label, limit_markers
from tests.widgets.streams import MAXSIZE, synthetic_run


def model_of(events: list[ev.Event]) -> EventModel:
    model = EventModel()
    model.feed(events)
    return model


def observed(model: EventModel, as_of: int | None = None) -> ObservedMaps | None:
    """The plan of the maps the first rank with a ParamsBuilt and a map used, iteration 0's
    hook order giving the order the rebuild follows (None before the constructor's map)."""
    maps = model.maps(as_of)
    states = model.construction(model.settled(CONSTRUCTION, as_of))
    rank = next((r for r, s in states.items() if s.params is not None and maps.get(r)), None)
    if rank is None:
        return None
    built = states[rank].params
    assert built is not None and isinstance(built.event, ev.ParamsBuilt)
    order = None
    records = model.step_records(0, as_of).get(rank)
    if records is not None and records.backward_end is not None and not records.summarized:
        order = hook_columns(records.grads)[0].tolist()
    return observed_plan(built.event, maps[rank], rank=rank, grad_ready_order=order)


def in_force(obs: ObservedMaps, step: int) -> Which:
    return ("rebuilt" if obs.rebuilt_step is not None and step >= obs.rebuilt_step
            else "initial")


def timing(model: EventModel, obs: ObservedMaps, step: int) -> tuple[BucketAverages, ...]:
    """Per-bucket timing over the iterations up to `step` that used the map in force there."""
    which = in_force(obs, step)
    steps = [s for s in model.steps if s <= step and (
        (obs.rebuilt_step is None or s < obs.rebuilt_step) if which == "initial"
        else s >= (obs.rebuilt_step or 0))]
    return bucket_averages(model.step_history(), steps)


def assigned(events: list[ev.Event], rank: int = 0) -> list[ev.BucketAssigned]:
    return [e for e in events if isinstance(e, ev.BucketAssigned) and e.rank == rank]


def test_the_maps_observed_are_the_maps_the_events_carried() -> None:
    events = synthetic_run(2, 8, 3, cap=int(0.001 * 2**20))  # what bucket_cap_mb=0.001 gives
    model = model_of(events)
    obs = observed(model)
    initial, rebuilt = assigned(events)
    assert obs is not None
    plan = obs.plan
    assert plan.bucket_indices("initial") == [list(b) for b in initial.buckets]
    assert plan.bucket_indices("rebuilt") == [list(b) for b in rebuilt.buckets]
    assert [b.limit for b in plan.rebuilt or ()] == list(rebuilt.limits)
    assert obs.rebuilt_step == 1 and plan.settings.bucket_cap_mb == 0.001
    assert in_force(obs, model.steps[-1]) == "rebuilt" and in_force(obs, 0) == "initial"
    assert "rebuilt map observed on rank 0 (iteration 1 on)" in plan.notes
    figure = BucketMap(plan, which="rebuilt").figure  # the planner's map of it: a bar each
    assert sum(len(t.x) for t in bar_traces(figure)) == 8


def test_before_the_rebuild_the_rebuilt_map_is_predicted_and_labelled_so() -> None:
    obs = observed(model_of([e for e in synthetic_run(2, 8, 3, cap=1100) if e.step <= 0]))
    assert obs is not None and obs.rebuilt_step is None
    plan = obs.plan
    assert plan.rebuilt is not None  # torch will rebuild (find_unused_parameters=False)
    assert plan.order_source == "measured"  # iteration 0's hooks give the order
    assert "rebuilt map predicted by the planner: not rebuilt yet in this run" in plan.notes


def test_per_bucket_timing_averages_the_iterations_of_the_map_in_force() -> None:
    events = synthetic_run(2, 8, 4, cap=1100, allreduce_us=900)
    model = model_of(events)
    obs = observed(model)
    assert obs is not None and in_force(obs, 3) == "rebuilt"
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
    averages = timing(model, obs, 3)
    assert [t.bucket for t in averages] == sorted(durations)
    for t in averages:
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


def test_each_ranks_maps_are_kept_so_a_rank_whose_maps_differ_shows() -> None:
    events = synthetic_run(2, 8, 2, cap=1100)
    swapped = []
    for e in events:
        if isinstance(e, ev.BucketAssigned) and e.rank == 1 and e.rebuilt:
            e = ev.BucketAssigned(1, e.step, e.t_ns, e.seq, tuple(reversed(e.buckets)),
                                  e.limits, True)
        swapped.append(e)
    maps = model_of(swapped).maps()
    mine = [(m.event.rebuilt, m.event.buckets) for m in maps[0]]  # type: ignore[attr-defined]
    theirs = [(m.event.rebuilt, m.event.buckets) for m in maps[1]]  # type: ignore[attr-defined]
    assert mine[0] == theirs[0] and mine[1] != theirs[1]  # the constructor's agree


def test_nothing_is_observed_before_the_constructors_map() -> None:
    events = [e for e in synthetic_run(2, 4, 1) if not isinstance(e, ev.BucketAssigned)
              and e.step < 0]
    assert observed(model_of(events)) is None


def test_observed_plan_needs_the_constructors_map() -> None:
    built = next(e for e in synthetic_run(1, 2, 0) if isinstance(e, ev.ParamsBuilt))
    try:
        observed_plan(built, [])
    except ValueError as e:
        assert str(e).startswith("ddpviz: rank 0 reported no constructor BucketAssigned")
    else:
        raise AssertionError("observed_plan accepted no maps")


def test_maps_recorded_without_caps_are_planned_with_the_caps_said_not_recorded() -> None:
    # watch() records no caps where it cannot tell torch's (a learned map, a replay that
    # differs): the maps are planned, each bucket's cap "not recorded", no limit marker
    events = [msgspec.structs.replace(e, limits=()) if isinstance(e, ev.BucketAssigned) else e
              for e in synthetic_run(2, 8, 3, cap=1100)]
    obs = observed(model_of(events))
    assert obs is not None
    plan = obs.plan
    assert plan.rebuilt is not None and len(plan.rebuilt) > 1
    assert {b.limit for b in (*plan.initial, *plan.rebuilt)} == {NOT_RECORDED}
    assert all(bucket_label(b).endswith("cap not recorded") for b in plan.rebuilt)
    assert limit_markers(plan.rebuilt) == []
    assert "not recorded" in str(plan) and "-1 B" not in str(plan)  # print(plan)
