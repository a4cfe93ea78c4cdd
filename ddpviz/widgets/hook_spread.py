"""One iteration across many ranks as distributions: per bucket, when its gradients were ready
and when its all-reduce ran, as spreads over ranks; and the ranks that finished backward
compute last (the stragglers every all-reduce waits for). Plain data over an IterationView.

Times are ns after the view's window start (`IterationView.t0`, aligned clocks), so one rank's
lane can be drawn on the same axis as the distribution.
"""

from __future__ import annotations

from typing import NamedTuple

from ddpviz.widgets.hook_analysis import IterationView
from ddpviz.widgets.rank_groups import Spread, slowest, spread


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
    per: dict[int, dict[str, dict[int, float]]] = {}  # bucket -> what -> rank -> value

    def put(b: int, what: str, rank: int, value: float) -> None:
        per.setdefault(b, {}).setdefault(what, {})[rank] = value

    ends: dict[int, float] = {}
    backward: list[float] = []
    for r, lane in view.lanes.items():
        rec = lane.record
        if lane.compute_end is not None and rec.grads:
            ends[r] = lane.compute_end - t0
        if rec.backward is not None and rec.backward_end is not None:
            backward.append((rec.backward_end - rec.backward) / 1e6)
        for b, t in rec.bucket_ready.items():
            put(b, "ready", r, t - t0)
        for s in lane.allreduce:
            put(s.bucket, "launched", r, s.start - t0)
            if s.end is not None:
                put(s.bucket, "done", r, s.end - t0)
                put(s.bucket, "ar", r, (s.end - s.start) / 1e6)
                put(s.bucket, "exp", r, s.exposed_ns / 1e6)
    buckets = []
    for b, d in sorted(per.items()):
        ready = d.get("ready", {})
        latest = slowest(ready, 1)
        buckets.append(BucketSpread(
            b, spread(ready.values()), spread(d.get("launched", {}).values()),
            spread(d.get("done", {}).values()), spread(d.get("ar", {}).values()),
            spread(d.get("exp", {}).values()), latest[0][0] if latest else None))
    end_spread = spread(ends.values())
    median = end_spread.p50 if end_spread else 0.0
    stragglers = tuple(Straggler(r, int(v), (v - median) / 1e6)
                       for r, v in slowest(ends, n_slowest))
    exposed = spread(lane.exposed_ns / 1e6 for lane in view.lanes.values()
                     if lane.compute_end is not None)
    return IterationSpread(view.step, len(view.lanes), end_spread, spread(backward), exposed,
                           tuple(buckets), stragglers)
