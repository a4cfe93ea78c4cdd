"""One iteration's hooks and all-reduces, analysed across ranks: plain data, no widgets.

Per rank: the order its gradient hooks fired in, each bucket's all-reduce span, and how much of
that span was exposed, i.e. still running after the rank's last gradient hook (backward
compute is over then, and the reducer can only wait). Across ranks: the most common firing
order and every position where a rank departs from it (different orders across ranks make
DDP rebuild different buckets, or hang), and per-bucket timing. On a step recorded at an
aggregated detail level ("buckets"/"sampled": GradsSummarized, no GradReady) a lane has no
firing order; its backward compute ends at the last summarized gradient.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from statistics import fmean
from typing import NamedTuple

import numpy as np

from ddpviz.model.event_model import GradArray, Grads, StepRecord


class AllReduceSpan(NamedTuple):
    bucket: int
    start: int  # AllReduceLaunched, aligned ns
    end: int | None  # AllReduceDone; None: not done (yet, or ever)
    nbytes: int
    dtype: str
    exposed_ns: int  # the part after the rank's last gradient hook


class Lane(NamedTuple):
    """One rank in one iteration."""

    rank: int
    record: StepRecord
    order: tuple[int, ...]  # parameter indices in hook firing order
    compute_end: int | None  # last GradReady: backward compute is over
    allreduce: tuple[AllReduceSpan, ...]
    exposed_ns: int  # from compute_end to the last all-reduce done
    # reported unused, or never ready though backward finished: the first MAX_UNUSED_LISTED
    # of them (a lane that fired one hook of a 30,000-parameter model is not given 29,999
    # indices, on each of thousands of ranks), and how many in all
    unused: tuple[int, ...]
    n_unused: int = 0

    @property
    def summarized(self) -> bool:
        """Per-bucket summaries only: no per-parameter hooks recorded (order is empty)."""
        return self.record.summarized


class OrderDiff(NamedTuple):
    reference: tuple[int, ...]  # the most common order (ties: the lowest rank's)
    reference_ranks: tuple[int, ...]
    # rank -> the first MAX_DEPARTURES_LISTED positions where it departs from the reference
    positions: dict[int, tuple[int, ...]]
    departures: dict[int, int]  # rank -> how many positions depart, in all

    @property
    def differs(self) -> bool:
        return any(self.positions.values())


class BucketTiming(NamedTuple):
    """One bucket across ranks (ms; max over ranks unless noted)."""

    bucket: int
    nbytes: int
    dtype: str
    n_params: int  # gradient hooks seen for it (max over ranks)
    ready_ms: float | None  # BucketReady after BackwardStarted
    allreduce_ms: float | None  # launch -> done
    exposed_ms: float | None
    exposed_mean_ms: float | None  # mean over ranks


class IterationView(NamedTuple):
    step: int
    lanes: dict[int, Lane]
    t0: int  # the window drawn: earliest start over ranks
    t1: int  # latest event over ranks
    order: OrderDiff
    buckets: tuple[BucketTiming, ...]
    summarized: tuple[int, ...] = ()  # ranks whose step has per-bucket summaries only

    @property
    def unused(self) -> dict[int, tuple[int, ...]]:
        return {r: lane.unused for r, lane in self.lanes.items() if lane.unused}


def compute_end(rec: StepRecord) -> int | None:
    """The last gradient ready (hook, or summary's last), else BackwardStarted."""
    if rec.grads:
        return rec.grads[-1][0]
    if rec.summaries:
        return max(s.last for s in rec.summaries.values())
    return rec.backward


def hook_columns(grads: Grads) -> tuple[np.ndarray, np.ndarray]:
    """(parameters, buckets) of a step's hooks in firing order, as int64 columns (a trace's
    GradArray hands its own; a live feed's list is converted)."""
    if isinstance(grads, GradArray):
        return grads.param_column(), grads.bucket_column()
    if not grads:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return (np.array([p for _, p, _ in grads], dtype=np.int64),
            np.array([b for _, _, b in grads], dtype=np.int64))


def _lane(rank: int, rec: StepRecord, n_params: int | None) -> Lane:
    fired, _ = hook_columns(rec.grads)
    order = tuple(fired.tolist())
    end = compute_end(rec)
    spans = []
    for b, (start, nbytes, dtype) in sorted(rec.launched.items()):
        done = rec.done.get(b)
        exposed = 0
        if done is not None and end is not None:
            exposed = max(0, done - max(start, end))
        spans.append(AllReduceSpan(b, start, done, nbytes, dtype, exposed))
    ends = [s.end for s in spans if s.end is not None]
    exposed_total = max(0, max(ends) - end) if ends and end is not None else 0
    unused, n_unused = _unused(rec.unused, fired, n_params if rec.backward_end is not None
                               and rec.grads else None)
    return Lane(rank, rec, order, end, tuple(spans), exposed_total, unused, n_unused)


MAX_UNUSED_LISTED = 64


def _unused(reported: Iterable[int], fired: Iterable[int] | np.ndarray, n_params: int | None
            ) -> tuple[tuple[int, ...], int]:
    """The first MAX_UNUSED_LISTED of `reported` | (range(n_params) - `fired`), and how many
    there are: linear in what the rank reported, not in n_params."""
    out = set(reported)
    if n_params is None:
        return tuple(sorted(out)[:MAX_UNUSED_LISTED]), len(out)
    hooks = np.asarray(fired if isinstance(fired, np.ndarray) else list(fired), dtype=np.int64)
    hooks = hooks[(hooks >= 0) & (hooks < n_params)]
    rep = np.array(sorted(out), dtype=np.int64)
    inside = (rep >= 0) & (rep < n_params)
    if n_params <= 2 * len(hooks) + 1024:  # a mask over the parameters costs no more
        mask = np.zeros(n_params, dtype=bool)
        mask[hooks] = True
        n_done = int(np.count_nonzero(mask))
        first = np.flatnonzero(~mask)[:MAX_UNUSED_LISTED].tolist()
        fired_too = int(np.count_nonzero(mask[rep[inside]]))
    else:
        done = np.unique(hooks)
        n_done = len(done)
        # the first MAX_UNUSED_LISTED indices not fired lie below len(done) + that many
        low = np.arange(min(n_params, n_done + MAX_UNUSED_LISTED), dtype=np.int64)
        first = low[~np.isin(low, done, assume_unique=True)][:MAX_UNUSED_LISTED].tolist()
        fired_too = int(np.count_nonzero(np.isin(rep[inside], done, assume_unique=True)))
    extra = int(np.count_nonzero(~inside)) + fired_too
    listed = sorted(out | set(first))[:MAX_UNUSED_LISTED]
    return tuple(listed), n_params - n_done + extra


def order_diff(orders: Mapping[int, tuple[int, ...]]) -> OrderDiff:
    """The reference order and each rank's departures from it, position by position."""
    if not orders:
        return OrderDiff((), (), {}, {})
    # ranks with the same order (all but a few, usually) are compared once, in numpy
    by_order: dict[tuple[int, ...], list[int]] = {}
    for r in sorted(orders):
        by_order.setdefault(orders[r], []).append(r)
    groups = sorted(by_order.items(), key=lambda g: (-len(g[1]), g[1][0]))
    ref_ranks = tuple(groups[0][1])
    reference = orders[ref_ranks[0]]
    ref = np.array(reference, dtype=np.int64)
    found: dict[int, tuple[tuple[int, ...], int]] = {}  # rank -> (positions, departures)
    for o, ranks in groups:
        # the shared prefix compared (linear in this rank's own hooks), the rest counted: a
        # rank that fired 1 hook is not compared position by position with 30,000
        common = min(len(o), len(reference))
        first = np.flatnonzero(np.array(o[:common], dtype=np.int64) != ref[:common])
        count = len(first) + max(len(o), len(reference)) - common
        tail = range(common, common + max(0, MAX_DEPARTURES_LISTED - len(first)))
        positions = tuple(first[:MAX_DEPARTURES_LISTED].tolist()) + tuple(
            i for i in tail if i < common + count - len(first))
        for r in ranks:
            found[r] = (positions, count)
    return OrderDiff(reference, ref_ranks, {r: found[r][0] for r in orders},
                     {r: found[r][1] for r in orders})


MAX_DEPARTURES_LISTED = 256  # positions kept per rank where its order departs


def _counts(values: np.ndarray) -> dict[int, int]:
    """{value: how many times} of an int column (bucket indices: small, not negative)."""
    if len(values) and int(values.min()) >= 0 and int(values.max()) < 4 * len(values) + 1024:
        n = np.bincount(values)
        ids = np.flatnonzero(n)
        return dict(zip(ids.tolist(), n[ids].tolist(), strict=True))
    ids, n = np.unique(values, return_counts=True)
    return dict(zip(ids.tolist(), n.tolist(), strict=True))


def analyse(step: int, records: Mapping[int, StepRecord],
            n_params: int | None = None) -> IterationView:
    """The iteration `step` from each rank's record (EventModel.step_records)."""
    lanes: dict[int, Lane] = {}
    distinct: dict[tuple[int, ...], tuple[int, ...]] = {}  # one tuple per distinct order
    for r, rec in sorted(records.items()):
        lane = _lane(r, rec, n_params)
        fired = distinct.setdefault(lane.order, lane.order)  # ranks fire alike: ~80 MB
        lanes[r] = lane if fired is lane.order else lane._replace(order=fired)  # at 256x10k
    starts = [x for lane in lanes.values()
              for x in (lane.record.forward, lane.record.backward, lane.record.first)
              if x is not None]
    t0 = min(starts) if starts else 0
    t1 = max([lane.record.last for lane in lanes.values()] + [t0])
    # Ranks still inside backward are compared on the prefix they have.
    # Summarized lanes have no order to compare (per-parameter hooks not recorded).
    summarized = tuple(r for r, lane in lanes.items() if lane.summarized)
    order = order_diff({r: lane.order for r, lane in lanes.items() if not lane.summarized})
    buckets: dict[int, dict[str, list[float]]] = {}
    info: dict[int, tuple[int, str]] = {}
    counts: dict[int, int] = {}
    for lane in lanes.values():
        rec = lane.record
        per_bucket: dict[int, int] = {}
        if rec.grads:
            per_bucket = _counts(hook_columns(rec.grads)[1])
        else:
            for b, summary in rec.summaries.items():
                per_bucket[b] = summary.n_grads
        for b, n in per_bucket.items():
            counts[b] = max(counts.get(b, 0), n)
        for s in lane.allreduce:
            d = buckets.setdefault(s.bucket, {"ready": [], "ar": [], "exp": []})
            info[s.bucket] = (s.nbytes, s.dtype)
            if s.end is not None:
                d["ar"].append((s.end - s.start) / 1e6)
                d["exp"].append(s.exposed_ns / 1e6)
        for b, t in rec.bucket_ready.items():
            d = buckets.setdefault(b, {"ready": [], "ar": [], "exp": []})
            if rec.backward is not None:
                d["ready"].append((t - rec.backward) / 1e6)
    timing = tuple(BucketTiming(
        b, info.get(b, (0, ""))[0], info.get(b, (0, ""))[1], counts.get(b, 0),
        max(d["ready"]) if d["ready"] else None, max(d["ar"]) if d["ar"] else None,
        max(d["exp"]) if d["exp"] else None, fmean(d["exp"]) if d["exp"] else None)
        for b, d in sorted(buckets.items()))
    return IterationView(step, lanes, t0, t1, order, timing, summarized)


class BucketAverages(NamedTuple):
    """One bucket over many iterations (ms, means over iterations of the max over ranks)."""

    bucket: int
    iterations: int
    ready_ms: float | None
    allreduce_ms: float | None
    exposed_ms: float | None


def bucket_averages(history: Mapping[int, Mapping[int, StepRecord]],
                    steps: list[int]) -> tuple[BucketAverages, ...]:
    """Per-bucket timing averaged over `steps` (e.g. every iteration one bucket map served).
    Reads only the per-bucket instants, never the per-parameter hooks: cheap at any scale."""
    acc: dict[int, dict[str, list[float]]] = {}
    for step in steps:
        # per bucket, the max over ranks of each time (0.0 at least), written out: this loop
        # runs ranks x buckets times per step (256 x 100 x 5 at the scale of benchmarks/)
        ready: dict[int, float] = {}
        took: dict[int, float] = {}
        exposed: dict[int, float] = {}
        seen: dict[int, None] = {}  # buckets launched or ready on some rank
        for rec in history.get(step, {}).values():
            end_ns = compute_end(rec)
            done = rec.done
            for b, (start, _, _) in rec.launched.items():
                seen[b] = None
                end = done.get(b)
                if end is None:
                    continue
                x = (end - start) / 1e6
                if x > (p := took.get(b, 0.0)) or b not in took:
                    took[b] = x if x > p else p
                if end_ns is not None:
                    late = end - (start if start > end_ns else end_ns)
                    x = (late if late > 0 else 0) / 1e6
                    if x > (p := exposed.get(b, 0.0)) or b not in exposed:
                        exposed[b] = x if x > p else p
            if rec.backward is not None:
                backward = rec.backward
                for b, t in rec.bucket_ready.items():
                    seen[b] = None
                    x = (t - backward) / 1e6
                    if x > (p := ready.get(b, 0.0)) or b not in ready:
                        ready[b] = x if x > p else p
        for b in seen:
            a = acc.setdefault(b, {"ready": [], "ar": [], "exp": []})
            for k, values in (("ready", ready), ("ar", took), ("exp", exposed)):
                if b in values:
                    a[k].append(values[b])
    return tuple(BucketAverages(b, max(len(d["ar"]), len(d["ready"])),
                                fmean(d["ready"]) if d["ready"] else None,
                                fmean(d["ar"]) if d["ar"] else None,
                                fmean(d["exp"]) if d["exp"] else None)
                 for b, d in sorted(acc.items()))
