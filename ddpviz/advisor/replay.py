"""Replay DDP's reducer over a recorded step with other buckets.

For a candidate setting the exact planner (ddpviz.plan: the assignment, the rebuild in
gradient-ready order, the 1 MiB first bucket, cap lists, DDP_SET_LAST_BUCKET_CAP) gives the
buckets; the replay then walks each rank's recorded gradient-ready times, launches each bucket
once all of its gradients are ready and every earlier bucket has launched (DDP's in-order
launch), charges the training thread the measured launch cost per bucket, runs the all-reduces
through the in-order queue with the cost model, and adds the recorded time outside backward.
Prediction = the recorded step time + (replayed candidate - replayed current setting), step by
step, so what the replay does not model cancels out.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ddpviz.advisor.commqueue import finish_times, seen_done
from ddpviz.advisor.costmodel import NS, CostModel
from ddpviz.advisor.timeline import Timeline, forward_of
from ddpviz.plan import PlannedBucket


class StepReplay(NamedTuple):
    """One step replayed: seconds; exposure for the rank whose step ends last."""

    step: int
    rank: int  # that rank
    step_s: float  # forward start to next forward start, mean over ranks
    exposed_s: float  # last bucket seen done minus last gradient ready
    last_start_after_ready_s: float  # when the last bucket's all-reduce started, after the
    # last gradient was ready (negative: before)


def bucket_costs(buckets: Sequence[PlannedBucket], model: CostModel) -> np.ndarray:
    return np.array([model.seconds(b.nbytes, b.dtype) for b in buckets], dtype=np.float64)


def _launches(timeline: Timeline, step: int, rank: int, t0: int,
              buckets: Sequence[tuple[int, ...]], launch_overhead_s: float,
              backward_start: int) -> tuple[list[float], float]:
    """Launch times (s after t0) of `buckets` on one rank, and its last gradient-ready time
    with the launch costs of these buckets in place of the recorded ones."""
    observed = sorted(t for t, _, _ in timeline.records[step][rank].launched.values())
    owner = {i: b for b, members in enumerate(buckets) for i in members}
    pending = [len(m) for m in buckets]
    ready = dict(timeline.ready(step, rank))
    for members in buckets:  # a parameter with no hook this step: ready with the first hook
        for i in members:
            ready.setdefault(i, backward_start)
    launches: list[float] = [0.0] * len(buckets)
    next_bucket, launched, k_obs, last = 0, 0, 0, 0.0
    for i in sorted(ready, key=lambda x: ready[x]):
        t_ns = ready[i]
        while k_obs < len(observed) and observed[k_obs] < t_ns:
            k_obs += 1
        t = (t_ns - t0) * NS + launch_overhead_s * (launched - k_obs)
        last = max(last, t)
        b = owner.get(i)
        if b is None:
            continue
        pending[b] -= 1
        while next_bucket < len(buckets) and pending[next_bucket] == 0:
            launches[next_bucket] = t
            t += launch_overhead_s  # the launch runs on the training thread
            launched += 1
            next_bucket += 1
        last = max(last, t)
    return launches, last


def replay_step(timeline: Timeline, step: int, buckets: Sequence[PlannedBucket],
                model: CostModel, contention: float = 0.0) -> StepReplay:
    """Replay one recorded step with `buckets` (reduction order). `contention` (0..1) is the
    share of the all-reduce time hidden behind the backward that still lengthens the step
    (0: communication overlaps compute for free; 1: they take turns on the same cores)."""
    recs = timeline.records[step]
    ranks = sorted(recs)
    t0 = min(forward_of(recs[r]) for r in ranks)
    members = [b.param_indices for b in buckets]
    launch = np.empty((len(buckets), len(ranks)))
    gate = np.empty(len(ranks))
    for j, r in enumerate(ranks):
        rec = recs[r]
        assert rec.backward is not None
        times, last = _launches(timeline, step, r, t0, members,
                                timeline.launch_overhead_ns * NS, rec.backward)
        launch[:, j] = times
        gate[j] = last
    cost = bucket_costs(buckets, model)
    fin = finish_times(launch, cost)
    seen = seen_done(fin, gate, timeline.finalize_ns * NS, timeline.done_seen_at_finalize)
    best: StepReplay | None = None
    steps_s = []
    for j, r in enumerate(ranks):
        rec = recs[r]
        next_forward = timeline.next_forward(step, r)
        assert rec.backward_end is not None and next_forward is not None
        obs_end = max(timeline.last_ready(step, r), max(rec.done.values()))
        tail = (rec.backward_end - obs_end) * NS
        after = (next_forward - rec.backward_end) * NS
        end = max(gate[j], seen[-1, j]) + tail
        exposed = max(0.0, float(seen[-1, j] - gate[j]))
        hidden = max(0.0, float(cost.sum()) - exposed)
        step_s = end + after - (forward_of(rec) - t0) * NS + contention * hidden
        steps_s.append(step_s)
        out = StepReplay(step, r, step_s, exposed, float(fin[-1] - cost[-1] - gate[j]))
        if best is None or out.step_s > best.step_s:
            best = out
    assert best is not None
    # every rank's step lasts as long on average (they meet in each all-reduce); the mean is
    # free of the per-step jitter a maximum over ranks would add
    return best._replace(step_s=sum(steps_s) / len(steps_s))


def observed_step_s(timeline: Timeline, step: int) -> float:
    """The recorded step time (forward to next forward), mean over ranks."""
    recs = timeline.records[step]
    return sum((timeline.next_forward(step, r) or forward_of(rec)) - forward_of(rec)
               for r, rec in recs.items()) * NS / len(recs)


@dataclass(frozen=True)
class Prediction:
    """A candidate's predicted step over the run's steady steps (medians, seconds)."""

    step_s: float  # recorded step + (replayed candidate - replayed current)
    exposed_s: float
    last_start_after_ready_s: float
    replayed_step_s: float  # the replay's own step time (before the recorded correction)


def predict(timeline: Timeline, steps: Sequence[int], buckets: Sequence[PlannedBucket],
            current: Sequence[PlannedBucket], model: CostModel,
            contention: float = 0.0) -> Prediction:
    """Predict `buckets` over `steps`, relative to the recorded run with `current`."""
    if not steps:
        raise ValueError("ddpviz: no steady step to replay; record at least 3 steps.")
    cand = [replay_step(timeline, s, buckets, model, contention) for s in steps]
    base = [replay_step(timeline, s, current, model, contention) for s in steps]
    steps_s = [observed_step_s(timeline, s) + c.step_s - b.step_s
               for s, c, b in zip(steps, cand, base, strict=True)]
    return Prediction(statistics.median(steps_s), statistics.median(c.exposed_s for c in cand),
                      statistics.median(c.last_start_after_ready_s for c in cand),
                      statistics.median(c.step_s for c in cand))
