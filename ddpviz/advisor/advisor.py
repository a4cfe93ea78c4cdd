"""`advise(source)`: predict other bucket settings from one recorded run, without rerunning.

[Note: what the advisor models] It replays each recorded step: gradient-ready times as
recorded, buckets from the exact planner (ddpviz.plan), in-order bucket launch, one process
group running the all-reduces one after another with a cost fitted from the run's own
all-reduces (or measured with `measure`), the rebuild in gradient-ready order. It does not
model comm hooks that change the bytes sent (compression), several process groups, or
compute/communication interference it cannot see (GPU kernels sharing memory bandwidth, CPU
cores shared by gloo and autograd): what the recorded run showed of these is kept as
recorded, so it is right for settings close to the recorded one and less so far from it.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import replace

from ddpviz.advisor.advice import Advice, Row, explain
from ddpviz.advisor.candidates import Candidate, default_candidates, validate_candidates
from ddpviz.advisor.costmodel import CostModel, fit_cost_model
from ddpviz.advisor.replay import observed_step_s, predict
from ddpviz.advisor.source import AdviceError, as_trace
from ddpviz.advisor.timeline import Timeline, build_timeline
from ddpviz.findings import recording_advice
from ddpviz.model.event_model import EventModel
from ddpviz.plan import MB, BucketPlan, PlannedBucket


def steady_map(plan: BucketPlan) -> tuple[PlannedBucket, ...]:
    """The map DDP uses from the rebuild on (the initial one where it never rebuilds)."""
    return plan.rebuilt if plan.rebuilt is not None else plan.initial


def plan_for(timeline: Timeline, c: Candidate) -> BucketPlan:
    """The exact planner's plan for candidate `c`, other settings as recorded."""
    return timeline.observed.plan.with_settings(
        bucket_cap_mb=c.bucket_cap_mb, bucket_cap_mb_list=c.bucket_cap_mb_list,
        set_last_bucket_cap=c.set_last_bucket_cap)


def current_candidate(timeline: Timeline) -> Candidate:
    """The recorded setting: the one the plan inferred from the recorded limits, or else the
    first reading of those limits (one cap, the cap list as recorded) whose planned map is the
    recorded map (a 1 MiB cap and torch's default share their first limit)."""
    s = timeline.observed.plan.settings
    inferred = Candidate("as recorded", s.bucket_cap_mb, s.bucket_cap_mb_list,
                         s.set_last_bucket_cap, family="current")
    recorded = timeline.current_buckets()
    plan = timeline.observed.plan
    limits = [b.limit for b in (plan.rebuilt if plan.rebuilt is not None and
                                timeline.observed.rebuilt_step is not None else plan.initial)]
    caps = [x / MB for x in limits if 0 < x < sys.maxsize]
    readings = [inferred]
    if caps:
        readings += [replace(inferred, bucket_cap_mb=max(caps), bucket_cap_mb_list=None),
                     replace(inferred, bucket_cap_mb=None, bucket_cap_mb_list=tuple(caps))]
    for c in readings:
        try:
            if tuple(b.param_indices for b in steady_map(plan_for(timeline, c))) == recorded:
                return c
        except ValueError:
            continue
    return inferred


def advise(source: object, *, candidates: object = None,
           cost_model: CostModel | None = None, contention: float = 0.0) -> Advice:
    """Which bucket setting this job should use, predicted from one recorded run.

    Args:
        source: a ddpviz.Run, Session, Trace, .ddpviz path (or folder of one run's per-rank
            files) of one run of ddpviz's DistributedDataParallel or of a torch DDP under
            ddpviz.watch,
            recorded with `recording=ddpviz.Recording(every=1)`,
            with at least 3 steps; or the run model already folded from one (the
            dashboard's `EventModel`, which spares folding the trace again).
        candidates: None for the default sweep (caps 0.25..256 MiB with and without the 1 MiB
            first bucket, torch's default with the small bucket last, bucket lists cut at layer
            boundaries), or a list of caps in MiB, cap lists, dicts or advise.Candidate.
        cost_model: measured all-reduce costs (`ddpviz.advisor.measure(pg)`): a dtype whose
            recorded buckets have fewer than two distinct sizes takes its latency from it (its
            bandwidth is still fitted from the run); used as is where the run has none.
        contention: 0..1, the share of all-reduce time hidden behind the backward that still
            lengthens the step. 0 (default): communication overlaps compute for free (a GPU
            with its own copy engines, or spare CPU cores); 1: they take turns on the same
            cores (CPU gloo with every core busy).

    Returns:
        The `Advice`; print it, or read `.to_records()`, or `.show()` it.

    Modeled: buckets from the exact planner (assignment, rebuild in gradient-ready order, the
    1 MiB first bucket, cap lists, DDP_SET_LAST_BUCKET_CAP), in-order bucket launch, one process
    group running all-reduces one after another, the rebuild. Not modeled: comm hooks that
    change the bytes sent, several process groups, compute/communication interference it cannot
    see (GPU kernels sharing memory bandwidth; CPU cores shared by gloo and autograd, for which
    `contention` is a knob, not a measurement). See [Note: what the advisor models].
    """
    if cost_model is not None and not isinstance(cost_model, CostModel):
        raise AdviceError(f"ddpviz: cost_model is a {type(cost_model).__name__}; expected the "
                          "CostModel that ddpviz.advisor.measure(process_group) returns, or None.")
    if isinstance(contention, bool) or not isinstance(contention, (int, float)) or \
            not 0.0 <= float(contention) <= 1.0:
        raise AdviceError(f"ddpviz: contention is {contention!r}; expected a number in [0, 1] "
                          "(0: communication overlaps compute for free, 1: they take turns).")
    user = validate_candidates(candidates) if candidates is not None else None
    timeline = build_timeline(source if isinstance(source, EventModel) else as_trace(source))
    steps = timeline.steady_steps()
    if not steps:
        n = len(timeline.records)
        raise AdviceError(
            f"ddpviz: the trace holds {n} step(s) but no step after the first that every one of "
            f"the {timeline.world_size} ranks recorded completely with the final bucket map.\n"
            "Record at least 3 training steps (forward, backward, optimizer) with per-parameter "
            f"gradient times ({recording_advice('every=1')}; the default, every=100, "
            "records them on steps 0-2 and every 100th only) and pass it again.")
    model = fit_cost_model(timeline, cost_model)
    cur_c = current_candidate(timeline)
    observed_map = timeline.current_buckets()
    cur_plan = timeline.observed.plan
    cur_buckets = cur_plan.rebuilt if cur_plan.rebuilt is not None and \
        timeline.observed.rebuilt_step is not None else cur_plan.initial
    notes = list(timeline.notes)
    predicted_current = steady_map(plan_for(timeline, cur_c))
    if tuple(b.param_indices for b in predicted_current) != observed_map:
        notes.append("the planner's map for the inferred current settings differs from the "
                     "recorded one (a bucket_cap_mb_list or a comm hook?): the recorded map is "
                     "used for the current setting")
    if timeline.observed.plan.rebuilt is None:
        notes.append("torch never rebuilds buckets in this run (find_unused_parameters=True "
                     "without static_graph): candidates keep registration order")
    cands = user if user is not None else default_candidates(
        timeline.params, timeline.grad_ready_order)
    rows = [Row(cur_c, cur_plan, tuple(cur_buckets),
                predict(timeline, steps, cur_buckets, cur_buckets, model,
                        contention), True)]
    for c in cands:
        try:
            plan = plan_for(timeline, c)
        except ValueError as e:
            raise AdviceError(f"ddpviz: candidate {c.label!r} cannot be planned: {e}") from None
        buckets = steady_map(plan)
        rows.append(Row(c, plan, buckets, predict(timeline, steps, buckets, cur_buckets, model,
                                             contention),
                        False))
    best, reason = explain(tuple(rows), model)
    measured = statistics.median(observed_step_s(timeline, s) for s in steps)
    if not model.separable:
        reason += (" (Uncertain: the cost model could not separate latency from bandwidth; "
                   "see its note.)")
    return Advice(tuple(rows), best, model, timeline.world_size, tuple(steps), measured, reason,
                  tuple(notes), float(contention))

