"""What one all-reduce costs in this job: latency + bytes / bandwidth, per dtype.

Fitted from the run's own AllReduceLaunched -> AllReduceDone pairs by replaying them through
the in-order queue (commqueue.py), so queueing behind an earlier bucket and (for ddpviz's DDP)
done times seen only at finalize are accounted for. A run whose buckets of one dtype have fewer
than two distinct sizes cannot tell latency from bandwidth: the model says so, and
`ddpviz.advisor.measure(process_group)` measures both instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ddpviz.advisor.commqueue import Array, finish_times, seen_done
from ddpviz.advisor.timeline import Timeline, forward_of

NS = 1e-9


@dataclass(frozen=True)
class Line:
    """Seconds for one all-reduce of n bytes: latency_s + n * seconds_per_byte."""

    latency_s: float
    seconds_per_byte: float

    def seconds(self, nbytes: int) -> float:
        return self.latency_s + nbytes * self.seconds_per_byte

    @property
    def bandwidth(self) -> float:
        """Bytes per second (inf when the fit found no per-byte cost)."""
        return 1.0 / self.seconds_per_byte if self.seconds_per_byte > 0 else float("inf")


@dataclass(frozen=True)
class CostModel:
    """All-reduce cost per dtype for one process group.

    Print it for one line per dtype; `seconds(nbytes, dtype)` for a prediction.
    """

    lines: Mapping[str, Line]  # dtype name -> its line
    source: str  # "fitted" (from the run's all-reduces) or "measured" (measure())
    distinct_sizes: Mapping[str, int] = field(default_factory=dict)
    samples: int = 0  # all-reduces (bucket x rank x step) the fit used
    notes: tuple[str, ...] = ()
    separable: bool = True  # latency and bandwidth both determined for every dtype

    def line(self, dtype: str) -> Line:
        """The cost line of one dtype.

        Args:
            dtype: torch's dtype name without "torch." ("float32", "bfloat16", ...).

        Returns:
            The dtype's fitted or measured line; for a dtype the run never all-reduced, the
            known line with the highest per-byte cost (a conservative guess); a zero line
            when the model has none.
        """
        if dtype in self.lines:
            return self.lines[dtype]
        if not self.lines:
            return Line(0.0, 0.0)
        # a dtype the run never all-reduced: the slowest per-byte line known (conservative)
        return max(self.lines.values(), key=lambda x: x.seconds_per_byte)

    def seconds(self, nbytes: int, dtype: str) -> float:
        """The predicted time of one all-reduce (latency + bytes / bandwidth).

        Args:
            nbytes: the size of the bucket all-reduced, in bytes.
            dtype: its dtype name, as for `line`.

        Returns:
            Seconds, from launch to done.
        """
        return self.line(dtype).seconds(nbytes)

    def __str__(self) -> str:
        out = [f"all-reduce cost model ({self.source}"
               + (f", {self.samples} all-reduces" if self.samples else "") + "):"]
        for dtype, ln in sorted(self.lines.items()):
            bw = "inf" if ln.bandwidth == float("inf") else f"{ln.bandwidth / 1e6:,.0f} MB/s"
            sizes = self.distinct_sizes.get(dtype)
            out.append(f"  {dtype:10} latency {ln.latency_s * 1e6:8.1f} us  bandwidth {bw}"
                       + (f"  ({sizes} distinct sizes)" if sizes is not None else ""))
        out += [f"  note: {n}" for n in self.notes]
        return "\n".join(out)


class _Obs:
    """One recorded step, as arrays (seconds, relative to the step's first forward)."""

    def __init__(self, launch: Array, done: Array, gate: Array, nbytes: list[int],
                 dtypes: list[str]) -> None:
        self.launch, self.done, self.gate, self.nbytes, self.dtypes = (
            launch, done, gate, np.array(nbytes, dtype=np.float64), dtypes)


def observations(timeline: Timeline) -> list[_Obs]:
    """The complete steps after the first, whatever map was in force."""
    out = []
    for step in sorted(timeline.records):
        recs = timeline.records[step]
        if step < 1 or len(recs) != timeline.world_size or not all(
                timeline.complete(step, r) for r in recs):
            continue
        ranks = sorted(recs)
        first = recs[ranks[0]]
        order = list(first.launched)  # buckets in launch order
        if any(list(recs[r].launched) != order for r in ranks):
            continue
        t0 = min(forward_of(recs[r]) for r in ranks)
        launch = np.array([[t - t0 for t, _, _ in recs[r].launched.values()]
                           for r in ranks]).T * NS
        done = np.array([[recs[r].done[b] - t0 for b in order] for r in ranks]).T * NS
        gate = np.array([timeline.last_ready(step, r) - t0 for r in ranks]) * NS
        out.append(_Obs(launch, done, gate, [nb for _, nb, _ in first.launched.values()],
                        [dt for _, _, dt in first.launched.values()]))
    return out


_ALPHA = np.concatenate([[0.0], np.logspace(-6, -1, 41)])  # seconds
_BETA = np.concatenate([[0.0], np.logspace(-12, -6, 49)])  # seconds per byte


def _sse(obs: list[_Obs], timeline: Timeline, fixed: dict[str, tuple[float, float]], dtype: str,
         alpha: Array, beta: Array) -> tuple[Array, Array]:
    """Squared error of seen done times, and total predicted all-reduce time, for each
    (alpha, beta) pair given to `dtype` (others fixed)."""
    sse = np.zeros(alpha.shape[0])
    total = np.zeros(alpha.shape[0])
    for o in obs:
        cost = np.empty((len(o.dtypes), alpha.shape[0]))
        for b, d in enumerate(o.dtypes):
            if d == dtype:
                cost[b] = alpha + beta * o.nbytes[b]
            else:
                a, s = fixed[d]
                cost[b] = a + s * o.nbytes[b]
        fin = finish_times(o.launch, cost)
        seen = seen_done(fin, o.gate, timeline.finalize_ns * NS, timeline.done_seen_at_finalize)
        sse += ((seen - o.done[:, :, None]) ** 2).sum(axis=(0, 1))
        total += cost.sum(axis=0)
    return sse, total


def _latency_bound(obs: list[_Obs]) -> dict[str, float]:
    """Per dtype, the shortest launch-to-done time of any recorded all-reduce: no latency can
    exceed it."""
    out: dict[str, float] = {}
    for o in obs:
        took = o.done.min(axis=1) - o.launch.max(axis=1)
        for d, t in zip(o.dtypes, took, strict=True):
            out[d] = min(out.get(d, np.inf), max(float(t), 0.0))
    return out


def _direct(obs: list[_Obs], timeline: Timeline, dtype: str) -> tuple[float, float] | None:
    """Least squares of service time on bytes over the all-reduces whose start and finish the
    record pins down (done not hidden by finalize, the previous one's finish known): a start
    for the search. None with fewer than two distinct sizes among them."""
    f = timeline.finalize_ns * NS
    pts: list[tuple[float, float]] = []
    for o in obs:
        done = o.done.min(axis=1)
        launch = o.launch.max(axis=1)
        prev_known, prev = True, -np.inf
        for b in range(len(o.dtypes)):
            pinned = not timeline.done_seen_at_finalize or (
                done[b] > o.gate.max() + f + 1e-6 and (b == 0 or done[b] > done[b - 1] + f + 1e-6))
            start_known = prev_known or launch[b] >= prev
            if pinned and start_known and o.dtypes[b] == dtype:
                pts.append((float(o.nbytes[b]), float(done[b] - max(launch[b], prev))))
            prev_known, prev = pinned, float(done[b])
    if len({x for x, _ in pts}) < 2:
        return None
    xs = np.array([x for x, _ in pts])
    ys = np.array([y for _, y in pts])
    slope, icpt = np.polyfit(xs, ys, 1)
    return max(float(icpt), 0.0), max(float(slope), 0.0)


def _pick(sse: Array, total: Array, n: int) -> int:
    """The best fit; among fits as good within noise (20 us per sample, or 0.1%), the one with
    the most all-reduce time (communication hidden behind compute is only bounded above)."""
    tol = sse.min() * 1.001 + n * (2e-5) ** 2
    ok = np.flatnonzero(sse <= tol)
    return int(ok[np.argmax(total[ok])])


def fit_cost_model(timeline: Timeline, prior: CostModel | None = None) -> CostModel:
    """Fit latency and bandwidth per dtype from the run's recorded all-reduces.

    With `prior` (e.g. from `measure`), a dtype whose buckets have fewer than two distinct
    sizes takes its latency from the prior and only its bandwidth from the run (which keeps
    what the run showed of compute/communication contention)."""
    obs = observations(timeline)
    if not obs:
        if prior is not None:
            return prior
        return CostModel({}, "fitted", {}, 0, (
            "no complete step after the first to fit all-reduce costs from; record at least "
            "3 steps",))
    sizes: dict[str, set[int]] = {}
    for o in obs:
        for d, n in zip(o.dtypes, o.nbytes, strict=True):
            sizes.setdefault(d, set()).add(int(n))
    n_samples = sum(o.done.size for o in obs)
    fixed: dict[str, tuple[float, float]] = {d: (0.0, 0.0) for d in sizes}
    notes = []
    few = {d for d, s in sizes.items() if len(s) < 2}
    fixed_alpha: dict[str, float] = {}
    if prior is not None and prior.lines:
        # where the run cannot tell latency from bandwidth, the measured latency fills in; the
        # bandwidth still comes from the run (it holds what the run showed of contention)
        for d in sorted(few):
            fixed_alpha[d] = prior.line(d).latency_s
            notes.append(f"{d}: the run's buckets have only {len(sizes[d])} distinct size(s); "
                         f"latency {fixed_alpha[d] * 1e6:.0f} us taken from the "
                         f"{prior.source} model, bandwidth fitted from the run")
    for d in sorted(few - set(fixed_alpha)):
        fixed_alpha[d] = 0.0
        notes.append(
            f"{d}: the run's buckets have only {len(sizes[d])} distinct size(s), so latency and "
            "bandwidth cannot be told apart; the fit puts the whole cost per byte (latency 0), "
            "which favours small buckets. Run ddpviz.advisor.measure(process_group) on the ranks "
            "and pass advise(..., cost_model=...) for a measured latency.")
    bound = _latency_bound(obs)
    for _round in range(3 if len(sizes) > 1 else 1):
        for d in sorted(sizes):
            alphas = np.array([fixed_alpha[d]]) if d in fixed_alpha else \
                _ALPHA[np.less_equal(_ALPHA, bound.get(d, np.inf))]
            aa, bb = (g.ravel() for g in np.meshgrid(alphas, _BETA, indexing="ij"))
            sse, total = _sse(obs, timeline, fixed, d, aa, bb)
            i = _pick(sse, total, n_samples)
            a0, b0 = aa[i], bb[i]
            start = None if d in fixed_alpha else _direct(obs, timeline, d)
            if start is not None and start[0] <= bound.get(d, np.inf):
                s_sse, _ = _sse(obs, timeline, fixed, d, np.array([start[0]]),
                                np.array([start[1]]))
                if s_sse[0] <= sse[i]:
                    a0, b0 = start
            # zoom in around the pick: a 9x9 window of +-0.2 decades, recentred while the pick
            # is on its edge (the valley between latency and bandwidth runs diagonally),
            # halved when it is inside
            span, moves = 0.2, 0
            while span > 1e-3 and moves < 60:
                moves += 1
                fa = np.array([a0]) if d in fixed_alpha or a0 == 0 else \
                    a0 * np.logspace(-span, span, 9)
                fa = fa[fa <= bound.get(d, np.inf)] if fa.size > 1 else fa
                if fa.size == 0:
                    fa = np.array([a0])
                fb = np.array([0.0]) if b0 == 0 else b0 * np.logspace(-span, span, 9)
                ra, rb = (g.ravel() for g in np.meshgrid(fa, fb, indexing="ij"))
                sse2, total2 = _sse(obs, timeline, fixed, d, ra, rb)
                j = _pick(sse2, total2, n_samples)
                ia, ib = divmod(j, fb.size)
                edge = (fa.size == 9 and ia in (0, 8)) or (fb.size == 9 and ib in (0, 8))
                a0, b0 = float(ra[j]), float(rb[j])
                if not edge:
                    span /= 2
            fixed[d] = (a0, b0)
    residual = 0.0
    if n_samples:
        sse, _ = _sse(obs, timeline, fixed, next(iter(sizes)),
                      np.array([fixed[next(iter(sizes))][0]]),
                      np.array([fixed[next(iter(sizes))][1]]))
        residual = float(np.sqrt(sse[0] / n_samples))
    notes.append(f"fit residual {residual * 1e3:.2f} ms per all-reduce done time")
    source = "fitted" if not fixed_alpha or not (prior and prior.lines) else \
        f"fitted, latency from {prior.source}"
    return CostModel({d: Line(*fixed[d]) for d in sizes}, source,
                     {d: len(s) for d, s in sizes.items()}, n_samples, tuple(notes),
                     separable=not few or bool(prior and prior.lines))
