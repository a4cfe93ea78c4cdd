"""Each rank's backward timeline, step by step, read from the run model.

The run model (ddpviz/model/event_model.py) folds a recorded run into per-(rank, step)
`StepRecord`s on the aligned clock: the forward and backward instants, when each gradient
became ready, each bucket's all-reduce launch (in launch order, with its bytes and dtype) and
when it was seen done, and the gaps between hooks that price a launch and finalize (see
[Note: hook gaps]). The timeline adds what the replay asks of them: the map in force per step,
the next forward, which steps are complete. The replay (replay.py) moves only what a bucket
setting changes and keeps the rest as measured.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from ddpviz import events as ev
from ddpviz.advisor.source import AdviceError
from ddpviz.findings import recording_advice
from ddpviz.model.event_model import EventModel, GradArray, StepRecord, Timed
from ddpviz.plan import ObservedMaps, PlannedParam, observed_plan
from ddpviz.traces.trace import Trace

Buckets = tuple[tuple[int, ...], ...]  # parameter indices per bucket, in reduction order


def _hooks(rec: StepRecord) -> tuple[np.ndarray, np.ndarray]:
    """The step's hooks as columns: aligned times and parameters, in hook order."""
    grads = rec.grads
    if isinstance(grads, GradArray) and len(grads.t) == len(grads):  # no hook fed as object
        return grads.t, grads.params
    rows = list(grads)
    return (np.array([g[0] for g in rows], dtype=np.int64),
            np.array([g[1] for g in rows], dtype=np.int64))


def ready_times(rec: StepRecord) -> dict[int, int]:
    """Parameter -> when its gradient first became ready in this step (in hook order)."""
    t, params = _hooks(rec)
    first = np.unique(params, return_index=True)[1]
    if len(first) < len(params):  # a parameter hooked twice: its first hook counts
        first.sort()
        t, params = t[first], params[first]
    return dict(zip(params.tolist(), t.tolist(), strict=True))


def forward_of(rec: StepRecord) -> int:
    """The step's (last) ForwardStarted: every record of a Timeline has one."""
    assert rec.forward is not None
    return rec.forward


def _trained(rec: StepRecord) -> bool:
    """The step's backward ran after its last forward (an evaluation forward under no_grad
    after the backward repeats the step's ForwardStarted: the step then reads as forward only)."""
    return rec.forward is not None and rec.backward is not None and rec.forward <= rec.backward


@dataclass(frozen=True)
class Timeline:
    """A recorded run's backward timelines, ready to replay."""

    params: tuple[PlannedParam, ...]
    observed: ObservedMaps  # the maps rank `observed.rank` used (initial and, if seen, rebuilt)
    # step -> rank -> the run model's record, for the steps with a ForwardStarted
    records: dict[int, dict[int, StepRecord]]
    buckets: dict[int, dict[int, Buckets]]  # step -> rank -> the bucket map in force
    world_size: int
    grad_ready_order: tuple[int, ...]  # the order the rebuild used (iteration 0's hooks)
    # True for ddpviz's DDP and a watched torch DDP: AllReduceDone is emitted as the training
    # thread waits for each bucket in order after the backward, so a bucket that finished early
    # is seen done only then. False for traces that stamp each all-reduce as it completes
    # (watch() before it settled futures on the training thread).
    done_seen_at_finalize: bool
    launch_overhead_ns: float  # time one bucket launch takes on the training thread
    finalize_ns: float  # time finalize spends per bucket after its all-reduce is done
    notes: tuple[str, ...] = ()
    # (step, rank) -> ready times and the last of them: the replay asks for each candidate
    _ready: dict[tuple[int, int], tuple[dict[int, int], int]] = field(
        default_factory=dict, init=False, repr=False, compare=False)

    def ready(self, step: int, rank: int) -> dict[int, int]:
        """`ready_times` of `rank`'s `step` (computed once; do not modify)."""
        return self._ready_and_last(step, rank)[0]

    def last_ready(self, step: int, rank: int) -> int:
        """When `rank`'s last gradient of `step` became ready."""
        return self._ready_and_last(step, rank)[1]

    def _ready_and_last(self, step: int, rank: int) -> tuple[dict[int, int], int]:
        got = self._ready.get((step, rank))
        if got is None:
            ready = ready_times(self.records[step][rank])
            got = self._ready[(step, rank)] = (ready, max(ready.values(), default=0))
        return got

    def next_forward(self, step: int, rank: int) -> int | None:
        """When `rank` started the forward after `step` (its first ForwardStarted of step+1)."""
        after = self.records.get(step + 1, {}).get(rank)
        return after.first_forward if after is not None else None

    def complete(self, step: int, rank: int) -> bool:
        """Every piece the replay reads was recorded for `rank`'s `step`."""
        rec = self.records[step][rank]
        return (_trained(rec) and rec.backward_end is not None
                and self.next_forward(step, rank) is not None and bool(rec.grads)
                and bool(rec.launched) and len(rec.done) == len(rec.launched)
                and len(rec.launched) == len(self.buckets[step][rank]))

    def steady_steps(self) -> list[int]:
        """Steps every rank recorded completely, with the final map in force (after the
        rebuild) and not the first step (warm-up)."""
        final = self.observed.rebuilt_step
        first = max(1, final if final is not None else 1)
        out = []
        for s in sorted(self.records):
            recs = self.records[s]
            if s >= first and len(recs) == self.world_size and all(
                    self.complete(s, r) for r in recs) and len(set(self.buckets[s].values())) == 1:
                out.append(s)
        final_map = self.current_buckets()
        return [s for s in out if next(iter(self.buckets[s].values())) == final_map]

    def current_buckets(self) -> Buckets:
        plan = self.observed.plan
        buckets = plan.rebuilt if plan.rebuilt is not None and \
            self.observed.rebuilt_step is not None else plan.initial
        return tuple(b.param_indices for b in buckets)


def _maps_in_force(maps: list[Timed], steps: Sequence[int]) -> dict[int, Buckets]:
    """Step -> the rank's latest BucketAssigned of that step or before (a rebuild in a step's
    forward is in force for that step)."""
    out: dict[int, Buckets] = {}
    for s in steps:
        current: Buckets = ()
        for m in maps:
            if m.event.step <= s:
                current = tuple(tuple(b) for b in cast(ev.BucketAssigned, m.event).buckets)
        out[s] = current
    return out


def _gaps(rec: StepRecord) -> tuple[list[int], list[int]]:
    """The step's launch gaps and the gaps between consecutive hooks with nothing between
    (See [Note: hook gaps])."""
    launch = [gap for _, gap in rec.launch_gaps]
    t = _hooks(rec)[0]
    if len(t) < 2:
        return launch, []
    follows = np.ones(len(t), dtype=bool)  # right after the previous hook of the step
    follows[rec.hook_breaks] = False
    return launch, np.diff(t)[follows[1:]].tolist()


def _quartile(xs: Sequence[int]) -> float:
    """The lower quartile (0 for no data)."""
    return float(sorted(xs)[len(xs) // 4]) if xs else 0.0


def _median(xs: Sequence[int], default: float = 0.0) -> float:
    return float(statistics.median(xs)) if xs else default


def build_timeline(source: Trace | EventModel) -> Timeline:
    """Reconstruct every rank's backward timeline from a recorded trace, or from its run model
    (an `EventModel` already fed with it, `Trace.model()`: spares a second fold).

    Raises AdviceError when the trace has no ParamsBuilt/BucketAssigned (the constructor was
    not recorded), no per-parameter GradReady events (recorded with a coarser detail level), or
    no complete step.
    """
    if isinstance(source, Trace):
        return _build(source.model(), copy=False)
    with source.lock():  # a live model goes on folding: read copies, as of now
        return _build(source, copy=True)


def _build(model: EventModel, copy: bool) -> Timeline:
    states = model.rank_states()
    ranks = sorted(states)
    if not ranks:
        raise AdviceError("ddpviz: the trace holds no events.\nRecord a run with ddpviz's "
                          "DistributedDataParallel or ddpviz.watch(ddp) and pass it again.")
    built = sorted((s.params.t, r, s.params.event.seq, s.params)
                   for r, s in states.items() if s.params is not None)
    if not built:
        raise AdviceError(
            "ddpviz: the trace has no ParamsBuilt event, so the parameters (sizes, dtypes) are "
            f"unknown (ranks {ranks}).\nRecord from before the DDP constructor runs.")
    rank0 = built[0][1]
    history = model.step_history()
    records: dict[int, dict[int, StepRecord]] = {}
    buckets: dict[int, dict[int, Buckets]] = {}
    launch_gaps: list[int] = []
    ready_gaps: list[int] = []
    finalize_gaps: list[int] = []
    for r in ranks:
        steps = sorted(s for s in history if r in history[s])
        in_force = _maps_in_force(states[r].maps, steps)
        for s in steps:
            rec = history[s][r]
            lg, rg = _gaps(rec)
            launch_gaps += lg
            ready_gaps += rg
            finalize_gaps += rec.finalize_gaps  # finalize's work on the last bucket (see below)
            if rec.forward is not None:
                records.setdefault(s, {})[r] = rec.copy() if copy else rec
                buckets.setdefault(s, {})[r] = in_force[s]
    records = dict(sorted(records.items()))
    if not any(rec.grads and _trained(rec) for recs in records.values()
               for rec in recs.values()):
        raise AdviceError(
            "ddpviz: the trace has no GradReady events, so when each gradient became ready is "
            f"unknown.\nRecord with {recording_advice('every=1')} (or the default, "
            "every=100, whose first steps and every 100th are full).")
    rebuilt = [rec.rebuilt_order for _, rec in sorted(
        (s, recs[rank0]) for s, recs in history.items() if rank0 in recs)
        if rec.rebuilt_order is not None]
    order: list[int] = list(rebuilt[0]) if rebuilt else []
    if not order:
        rec0 = records[min(records)].get(rank0)
        if rec0 is not None and _trained(rec0):
            ready = ready_times(rec0)
            order = sorted(ready, key=lambda i: ready[i])
    try:
        observed = observed_plan(cast(ev.ParamsBuilt, built[0][3].event), states[rank0].maps,
                                 rank=rank0,
                                 grad_ready_order=order or None)
    except ValueError as e:
        raise AdviceError(str(e)) from None
    # ddpviz's DDP and watch() emit every AllReduceDone after the backward's last GradReady
    # (they wait in order); older watch() traces report early buckets as they finish.
    done_late = True
    for recs in records.values():
        for rec in recs.values():
            if rec.grads and rec.done and _trained(rec) and \
                    min(rec.done.values()) < max(ready_times(rec).values()):
                done_late = False
    # a bucket launch's cost on the training thread: how much longer the gap to the next
    # gradient is after a launch than between two gradients, both at their lower quartile
    # (a preempted rank or an all-reduce thread competing for the core only adds to a gap)
    launch = max(0.0, _quartile(launch_gaps) - _quartile(ready_gaps)) if launch_gaps else 0.0
    notes = []
    if not launch_gaps:
        notes.append("no bucket launch was followed by a gradient hook, so the launch cost on "
                     "the training thread is taken as 0")
    # what finalize spends on one bucket after its all-reduce: the time from the last bucket's
    # AllReduceDone to BackwardFinished (the gaps between earlier buckets' done times may be
    # the all-reduces themselves)
    finalize = _median(finalize_gaps) if done_late else 0.0
    params = observed.plan.params
    return Timeline(params, observed, records, buckets, len(ranks), tuple(order), done_late,
                    launch, finalize, tuple(notes))
