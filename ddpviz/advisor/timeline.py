"""Each rank's backward timeline, step by step, read back from a recorded run.

From ForwardStarted, BackwardStarted, GradReady, AllReduceLaunched, AllReduceDone and
BackwardFinished events (times aligned across ranks with the trace's clock offsets) it keeps,
per (step, rank): when each gradient became ready, when each bucket's all-reduce launched and
was seen done, and the time around backward (forward before it, optimizer and data after it).
The replay (replay.py) moves only what a bucket setting changes and keeps the rest as measured.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ddpviz import events as ev
from ddpviz.advisor.source import AdviceError
from ddpviz.plan import ObservedMaps, PlannedParam, observed_plan
from ddpviz.trace import Trace


class Launch(NamedTuple):
    """One bucket's all-reduce as a rank launched it."""

    bucket: int
    t_ns: int  # aligned time of AllReduceLaunched
    nbytes: int
    dtype: str


@dataclass
class StepRecord:
    """One rank's step: aligned ns times of what the replay needs."""

    rank: int
    step: int
    forward_ns: int  # ForwardStarted
    backward_start_ns: int | None = None  # BackwardStarted (first gradient hook)
    ready_ns: dict[int, int] = field(default_factory=dict)  # param index -> GradReady
    launches: list[Launch] = field(default_factory=list)  # in launch order
    done_ns: dict[int, int] = field(default_factory=dict)  # bucket -> AllReduceDone
    backward_end_ns: int | None = None  # BackwardFinished
    next_forward_ns: int | None = None  # the next step's ForwardStarted
    buckets: tuple[tuple[int, ...], ...] = ()  # the map in force (param indices per bucket)

    @property
    def complete(self) -> bool:
        """Every piece the replay reads was recorded."""
        return (self.backward_start_ns is not None and self.backward_end_ns is not None
                and self.next_forward_ns is not None and bool(self.ready_ns)
                and bool(self.launches) and len(self.done_ns) == len(self.launches)
                and len(self.launches) == len(self.buckets))

    @property
    def last_ready_ns(self) -> int:
        return max(self.ready_ns.values())


@dataclass(frozen=True)
class Timeline:
    """A recorded run's backward timelines, ready to replay."""

    params: tuple[PlannedParam, ...]
    observed: ObservedMaps  # the maps rank `observed.rank` used (initial and, if seen, rebuilt)
    records: dict[int, dict[int, StepRecord]]  # step -> rank -> record
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

    def steady_steps(self) -> list[int]:
        """Steps every rank recorded completely, with the final map in force (after the
        rebuild) and not the first step (warm-up)."""
        final = self.observed.rebuilt_step
        first = max(1, final if final is not None else 1)
        out = []
        for s in sorted(self.records):
            recs = self.records[s]
            if s >= first and len(recs) == self.world_size and all(
                    r.complete for r in recs.values()):
                maps = {r.buckets for r in recs.values()}
                if len(maps) == 1:
                    out.append(s)
        final_map = self.current_buckets()
        return [s for s in out if next(iter(self.records[s].values())).buckets == final_map]

    def current_buckets(self) -> tuple[tuple[int, ...], ...]:
        plan = self.observed.plan
        buckets = plan.rebuilt if plan.rebuilt is not None and \
            self.observed.rebuilt_step is not None else plan.initial
        return tuple(b.param_indices for b in buckets)


def _rank_records(trace: Trace, rank: int) -> tuple[dict[int, StepRecord], list[int], list[int],
                                                      list[int]]:
    records: dict[int, StepRecord] = {}
    current: tuple[tuple[int, ...], ...] = ()
    launch_gaps: list[int] = []
    ready_gaps: list[int] = []
    finalize_gaps: list[int] = []
    prev: ev.Event | None = None
    prev_t = 0
    for e in trace.events(rank):
        t = trace.aligned_ns(e)
        if prev is not None and prev.step == e.step and isinstance(e, ev.GradReady):
            if isinstance(prev, ev.AllReduceLaunched):
                launch_gaps.append(t - prev_t)
            elif isinstance(prev, ev.GradReady):
                ready_gaps.append(t - prev_t)
        if isinstance(e, ev.BackwardFinished) and isinstance(prev, ev.AllReduceDone):
            finalize_gaps.append(t - prev_t)  # finalize's work on the last bucket (see below)
        prev, prev_t = e, t
        if isinstance(e, ev.BucketAssigned):  # a rebuild in a step's forward: in force now
            current = tuple(tuple(b) for b in e.buckets)
            if e.step in records:
                records[e.step].buckets = current
            continue
        if isinstance(e, ev.ForwardStarted):
            before = records.get(e.step - 1)
            if before is not None and before.next_forward_ns is None:
                before.next_forward_ns = t
            records[e.step] = StepRecord(rank, e.step, t, buckets=current)
            continue
        rec = records.get(e.step)
        if rec is None:
            continue
        if isinstance(e, ev.BackwardStarted):
            rec.backward_start_ns = t
        elif isinstance(e, ev.GradReady):
            rec.ready_ns.setdefault(e.param, t)
        elif isinstance(e, ev.AllReduceLaunched):
            rec.launches.append(Launch(e.bucket, t, e.nbytes, e.dtype))
        elif isinstance(e, ev.AllReduceDone):
            rec.done_ns.setdefault(e.bucket, t)
        elif isinstance(e, ev.BackwardFinished):
            rec.backward_end_ns = t
    return records, launch_gaps, ready_gaps, finalize_gaps


def _quartile(xs: Sequence[int]) -> float:
    """The lower quartile (0 for no data)."""
    return float(sorted(xs)[len(xs) // 4]) if xs else 0.0


def _median(xs: Sequence[int], default: float = 0.0) -> float:
    return float(statistics.median(xs)) if xs else default


def build_timeline(trace: Trace) -> Timeline:
    """Reconstruct every rank's backward timeline from a recorded trace.

    Raises AdviceError when the trace has no ParamsBuilt/BucketAssigned (the constructor was
    not recorded), no per-parameter GradReady events (recorded with a coarser detail level), or
    no complete step.
    """
    ranks = trace.ranks
    if not ranks:
        raise AdviceError("ddpviz: the trace holds no events.\nRecord a run with ddpviz's "
                            "DistributedDataParallel or ddpviz.watch(ddp) and pass it again.")
    built = trace.of_type(ev.ParamsBuilt)
    if not built:
        raise AdviceError(
            "ddpviz: the trace has no ParamsBuilt event, so the parameters (sizes, dtypes) are "
            f"unknown (ranks {ranks}).\nRecord from before the DDP constructor runs.")
    rank0 = built[0].rank
    maps: list[Any] = [_Timed(trace.aligned_ns(e), e)  # the shape observed_plan reads
                       for e in trace.of_type(ev.BucketAssigned, rank=rank0)]
    rebuilt_events = trace.of_type(ev.BucketsRebuilt, rank=rank0)
    records: dict[int, dict[int, StepRecord]] = {}
    launch_gaps: list[int] = []
    ready_gaps: list[int] = []
    finalize_gaps: list[int] = []
    for r in ranks:
        recs, lg, rg, fg = _rank_records(trace, r)
        launch_gaps += lg
        ready_gaps += rg
        finalize_gaps += fg
        for s, rec in recs.items():
            records.setdefault(s, {})[r] = rec
    if not any(rec.ready_ns for recs in records.values() for rec in recs.values()):
        raise AdviceError(
            "ddpviz: the trace has no GradReady events, so when each gradient became ready is "
            "unknown.\nRecord with recording=ddpviz.Recording(every=1) (or the default, every=100, "
            "whose first steps and every 100th are full) for ddpviz.watch or ddpviz's "
            "DistributedDataParallel.")
    order: list[int] = list(rebuilt_events[0].grad_ready_order) if rebuilt_events else []
    if not order:
        first = min(records)
        rec0 = records[first].get(rank0)
        if rec0 is not None:
            order = sorted(rec0.ready_ns, key=lambda i: rec0.ready_ns[i])
    try:
        observed = observed_plan(built[0], maps, rank=rank0, grad_ready_order=order or None)
    except ValueError as e:
        raise AdviceError(str(e)) from None
    # ddpviz's DDP and watch() emit every AllReduceDone after the backward's last GradReady
    # (they wait in order); older watch() traces report early buckets as they finish.
    done_late = True
    for recs in records.values():
        for rec in recs.values():
            if rec.ready_ns and rec.done_ns and min(rec.done_ns.values()) < rec.last_ready_ns:
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
    return Timeline(params, observed, records, len(ranks), tuple(order), done_late, launch,
                    finalize, tuple(notes))


class _Timed(NamedTuple):  # what observed_plan reads (the shape of EventModel's Timed)
    t: int
    event: ev.Event
