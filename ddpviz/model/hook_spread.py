"""One iteration across many ranks as distributions: per bucket, when its gradients were ready
and when its all-reduce ran, as spreads over ranks; and the ranks that finished backward
compute last (the stragglers every all-reduce waits for). Plain data over an IterationView.

Times are ns after the view's window start (`IterationView.t0`, aligned clocks), so one rank's
lane can be drawn on the same axis as the distribution.
"""

from __future__ import annotations

from typing import NamedTuple

from ddpviz.model.hook_analysis import IterationView
from ddpviz.model.rank_groups import Spread, slowest, spread


class BucketSpread(NamedTuple):
    """One bucket across ranks (ns after the window start unless noted)."""

    bucket: int
    ready: Spread | None  # BucketReady
    launched: Spread | None  # AllReduceLaunched
    done: Spread | None  # AllReduceDone
    allreduce_ms: Spread | None  # launch -> done, ms
    exposed_ms: Spread | None  # the part after the rank's last hook, ms
    latest_rank: int | None  # the rank whose bucket was ready last


class Straggler(NamedTuple):
    rank: int
    compute_end: int  # last gradient hook, ns after the window start
    behind_ms: float  # after the median rank's last hook


class IterationSpread(NamedTuple):
    step: int
    n_ranks: int
    compute_end: Spread | None  # last gradient hook per rank (ns after the window start)
    backward_ms: Spread | None  # BackwardStarted -> BackwardFinished per rank
    exposed_ms: Spread | None  # per rank, all-reduce time after its last hook
    buckets: tuple[BucketSpread, ...]
    slowest: tuple[Straggler, ...]  # latest compute end first


def iteration_spread(view: IterationView, n_slowest: int = 5) -> IterationSpread:
    """Distributions across the ranks of `view` and its `n_slowest` stragglers."""
    t0 = view.t0
    ready: dict[int, dict[int, float]] = {}  # bucket -> rank -> ns after t0
    launched: dict[int, list[float]] = {}
    done: dict[int, list[float]] = {}
    took: dict[int, list[float]] = {}  # ms
    exposed_b: dict[int, list[float]] = {}  # ms
    ends: dict[int, float] = {}
    backward: list[float] = []
    for r, lane in view.lanes.items():
        rec = lane.record
        if lane.compute_end is not None and (rec.grads or rec.summaries):
            ends[r] = lane.compute_end - t0
        if rec.backward is not None and rec.backward_end is not None:
            backward.append((rec.backward_end - rec.backward) / 1e6)
        for b, t in rec.bucket_ready.items():
            ready.setdefault(b, {})[r] = t - t0
        for sp in lane.allreduce:
            launched.setdefault(sp.bucket, []).append(sp.start - t0)
            if sp.end is not None:
                done.setdefault(sp.bucket, []).append(sp.end - t0)
                took.setdefault(sp.bucket, []).append((sp.end - sp.start) / 1e6)
                exposed_b.setdefault(sp.bucket, []).append(sp.exposed_ns / 1e6)
    buckets = []
    for b in sorted(set(ready) | set(launched)):
        per_rank = ready.get(b, {})
        latest = slowest(per_rank, 1)
        buckets.append(BucketSpread(
            b, spread(per_rank.values()), spread(launched.get(b, ())), spread(done.get(b, ())),
            spread(took.get(b, ())), spread(exposed_b.get(b, ())),
            latest[0][0] if latest else None))
    end_spread = spread(ends.values())
    median = end_spread.p50 if end_spread else 0.0
    stragglers = tuple(Straggler(r, int(v), (v - median) / 1e6)
                       for r, v in slowest(ends, n_slowest))
    exposed = spread(lane.exposed_ns / 1e6 for lane in view.lanes.values()
                     if lane.compute_end is not None)
    return IterationSpread(view.step, len(view.lanes), end_spread, spread(backward), exposed,
                           tuple(buckets), stragglers)
