"""Who is slow: which rank each bucket's all-reduce waited for, and the `straggler` finding.

Pure numpy over the columnar store (ddpviz/traces/columns.py): no event objects, no torch.

Every all-reduce starts for real when the last rank launches it, so on each recorded step the
rank whose AllReduceLaunched (BucketReady where no launch was recorded) comes last made that
bucket wait, for the time between its launch and the one before it. Times are put on one clock
with the offsets ddpviz already estimates (`Trace.clock`: 0 on one host, the transport's ping
across hosts, wall clocks for merged files); a difference smaller than the two ranks' clock
uncertainty is attributed to nobody. See [Note: straggler verdict] for when a rank is named.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from ddpviz import events as ev
from ddpviz.findings import Finding, fix_for, format_ranks
from ddpviz.traces import columns as col
from ddpviz.traces.columns import Table
from ddpviz.units import human_duration as ms

# Offsets from wall clocks only (merged per-host files, error recorded as -1): NTP keeps hosts
# within a few ms; 10 ms is assumed, so only a rank late by more than that can be named.
UNKNOWN_CLOCK_ERROR_NS = 10_000_000
MAX_STEPS = 4096  # the latest steps analysed (per-step arrays are ranks x steps)
MAX_CELLS = 1 << 23  # ranks x steps x buckets of the launch cube (64 MiB of float64)
MIN_STEPS = 7  # recorded steps before a straggler can be named (P_STEADY needs 7 of 7)
MIN_SPLIT_STEPS = 3  # steps with optimizer-step events to split the gap before a forward
# sampled steps with every bucket launched on every rank to place a marked straggler's
# backward among the buckets (watch's default in a short run: steps 1 and 2, after the
# constructor's one bucket of step 0)
MIN_BUCKET_STEPS = 2
MIN_SHARE = 0.05  # a straggler costs at least this share of the median step time
P_STEADY = 1e-2  # the chance that a rank is later than the others' median that often
P_MAX = 1e-4  # the chance that one rank is last this often with every rank equally slow
MARK_STEADY = 0.75  # from the backward marks: late by the threshold in this share of steps

# [Note: straggler verdict]
# A rank k is named when, over the n recorded steps that every rank recorded:
#   1. n >= MIN_STEPS;
#   2. k's last launch is later than every other rank's by more than the clock uncertainty
#      of k against them (x_k > error: the step's last all-reduce waited for k, surely) in m
#      of n steps, m >= n / 4 (at 256 ranks the jitter of 255 others makes even a steady 20%
#      straggler last in only about half the steps), with P(Binomial(n, 1/world size) >= m)
#      <= P_MAX (one rank last by chance that often: rules out a lucky streak among few
#      ranks, 2 ranks: 14 of 14 steps, 18 of 19...; small because the verdict is asked again
#      at every step, live);
#   3. k's lateness against the other ranks' median exceeds max(clock uncertainty,
#      MIN_SHARE x median step time) in the median over steps, and the clock uncertainty in
#      more steps than chance allows (P(Binomial(n, 1/2) >= count) <= P_STEADY): k is slower
#      than a typical rank, steadily, by a margin that is neither clock error nor a rounding
#      of the step. (Against the latest other rank instead, 63 ranks' jitter would hide a 20%
#      straggler at 64 ranks; a healthy rank that had a few long stalls early on has a high
#      median, but is rarely later than the median rank in 11 of 12 steps: p = 0.003.)
# From the backward marks (every step of the default recording: more steps than the
# per-bucket events, so more power to call a small bias significant), k must also be later
# than the others' median by more than that threshold in MARK_STEADY of the steps: a rank
# slowed by a hog beside it (preempted in bursts, a quarter of the steps, 1-30 ms at steps of
# ~18 ms) loses time in some steps and none in the others; a slow rank loses it in nearly
# every step.
# The cost reported is x_k clipped at 0 (what the step's last all-reduce waited for k beyond
# the next-latest rank), median and p90 over the n steps.
# The clock uncertainty of a rank is the larger of its recorded error and how far its end of
# backward (which every rank leaves together: the last all-reduce) sits from the others'
# (median over steps): an offset that is wrong shifts a rank's end of backward too, a straggler
# does not.
# Steps with per-bucket events (all steps under the guard, the sampled ones by default) give
# the phase where k loses the time. Without enough of them, every synced step's
# BackwardComputed (hook-less watch: See [Note: backward marks] in probes/backward_marks.py)
# is asked next, on the end of each rank's own backward: the phase from the forward, the first
# gradient and that end (data / to_first_grad / backward), and within the backward the bucket
# the sampled steps' launches name (MIN_BUCKET_STEPS of them). Steps with only a ForwardStarted
# (every=never, old traces) can still show a rank that arrives late at the forward.
# Lateness at the forward is added between the previous backward's end (which the last
# all-reduce makes simultaneous) and the forward. Where the sampled steps recorded the
# optimizer step (OptimizerStepStarted/Finished, probes/optimizer_step.py), that gap is split
# on them: after the backward (its end to the optimizer's start: clipping, logging, host
# syncs), the optimizer step, and data loading (the optimizer's end to the next forward),
# each the median over at least MIN_SPLIT_STEPS such steps of k's added lateness against the
# others' median. Without them (old traces, or too few steps) the gap stays one phase, "data".

# [Note: lateness it did not add]
# Two ranks in lockstep can stay apart by a steady offset that neither adds: on a busy host
# (2 ranks and two CPU hogs on 2 cores) the ranks leave an all-reduce up to ~1.5 ms apart,
# and the one that leaves later stays later at every next forward and every end of backward,
# though each rank's forward, backward, optimizer step and data loading take as long as the
# other's and each waits as long between its end of backward and its next forward (measured:
# 92 of 120 steps, 1.36 ms median lateness, every phase within +-30 us). Its lateness at the
# forward then looks like slow data loading, and its end of backward like a slow backward.
# Only the sampled steps that recorded the all-reduce's end and the optimizer step
# (`split_steps`) tell it apart: the lateness is already there when the all-reduce ends. So
# where they exist, a rank is named only when the lateness it added in its own phases (the
# positive medians of the breakdown: after the backward, the optimizer step, data loading,
# and the forward and backward) reaches the threshold; otherwise nobody is named.
# The backward marks carry the same evidence on every step (`left`: when the rank left the
# previous step's all-reduces, See [Note: backward marks]): from them the gap before the
# forward is counted from that exit, the same test applies, and a steady skew of the exits
# widens the rank's clock uncertainty as a skew of the ends of backward does. Traces without
# it (older ones) and jobs without the marks keep the test of the sampled steps alone.
# Steps from the first non-finite value on are not read either (`before`): ddpviz checks
# that rank's steps in full from there (precise mode), which is ddpviz's own work, and the
# training has diverged (diagnose passes the first step a nonfinite_* finding names).

# [Note: a straggler that waits for a CPU]
# A rank beside a CPU hog is slower for real: on 2 cores, 2 ranks and a hog, the scheduler
# can leave the hog beside one rank for most of a run, and that rank was last in 26 of 31
# steps, 2-10 ms a step (measured here, healthy job, nothing planted). By the timings alone it
# is a straggler; its code is not slower. Each BackwardComputed carries the main thread's
# cumulative run-queue delay (See [Note: waiting for a CPU] in probes/cpu_wait.py), so the
# named rank's wait for a CPU a step beyond the other ranks' median is known (`cpu_wait_ns`,
# median over consecutive steps): in those runs 9.4 ms of 10.0 ms and 1.2 of 1.8 ms. Where it
# is at least half of the lateness (`cpu_explained`), the finding says so, as an info with
# field `cpu_wait` and the host's load as the thing to look at; a rank asleep in its own code
# (a sleep, a file read, a lock) does not count as waiting for a CPU and stays a warning.
# Where no BackwardComputed carries it (the guard's comm-hook strategy, old traces, not
# Linux), the finding says nothing of it and stays a warning.


class Timeline(NamedTuple):
    """Per-rank times on the aligned clock, ns since `t0`, NaN where not recorded."""

    ranks: np.ndarray  # (R,) rank numbers
    steps: np.ndarray  # (S,) steps with a ForwardStarted on some rank
    forward: np.ndarray  # (R, S) first ForwardStarted
    backward: np.ndarray  # (R, S) first BackwardStarted
    end: np.ndarray  # (R, S) last BackwardFinished
    optimizer: np.ndarray  # (R, S) first OptimizerStepStarted (after the step's backward)
    optimizer_end: np.ndarray  # (R, S) last OptimizerStepFinished
    bucket_steps: np.ndarray  # (Sb,) steps with a launch recorded on some rank
    buckets: np.ndarray  # (B,) bucket indices (reduction order)
    launch: np.ndarray  # (R, Sb, B) AllReduceLaunched (BucketReady without launches)
    stated_error_ns: np.ndarray  # (R,) clock error as recorded (unknown: assumed)
    error_ns: np.ndarray  # (R,) max(stated, measured skew at the end of backward)
    t0: int
    # (R, S) BackwardComputed: the end of the rank's own backward, before the wait, and its
    # first gradient (every synced step under hook-less watch: See [Note: backward marks])
    computed: np.ndarray | None = None
    first_grad: np.ndarray | None = None
    first_param: int = -1  # the parameter whose gradient `first_grad` times (the latest)
    # (R, S) the main thread's cumulative wait for a CPU at that BackwardComputed (ns, NaN
    # where not known: See [Note: waiting for a CPU] in probes/cpu_wait.py)
    cpu_wait: np.ndarray | None = None
    # (R, S) when the rank left step s-1's backward, its all-reduces waited for (the
    # BackwardComputed of s carries it: See [Note: backward marks]); NaN where not known
    left: np.ndarray | None = None


class Waits(NamedTuple):
    """Who made each bucket's all-reduce wait, per recorded step."""

    timeline: Timeline
    last: np.ndarray  # (Sb, B) index into timeline.ranks of the last rank; -1: nobody
    wait_ns: np.ndarray  # (Sb, B) its launch minus the one before it (0 where last is -1)
    unsure: np.ndarray  # (Sb, B) every rank launched but within the clock uncertainty


class WaitFold(NamedTuple):
    """`Waits` folded over steps: a rank x bucket table (what the views draw)."""

    ranks: tuple[int, ...]
    buckets: tuple[int, ...]
    n_last: np.ndarray  # (R, B) steps in which the rank made the bucket wait
    wait_ns: np.ndarray  # (R, B) total wait it caused
    steps: int  # steps with every rank's launch of at least one bucket
    unsure: int  # bucket-steps within the clock uncertainty (attributed to nobody)
    max_error_ns: int  # the largest clock uncertainty of a rank


class Straggler(NamedTuple):
    rank: int
    steps: int  # recorded steps looked at
    last_in: int  # steps in which it was last by more than the clock uncertainty
    median_ns: float  # wait it caused (0 on steps it was not last), median over steps
    p90_ns: float
    threshold_ns: float
    error_ns: float  # clock uncertainty against the others
    # "data" | "forward" | "backward" | "compute"; with optimizer-step events also
    # "optimizer" | "after_backward" (and "data" is then data loading alone)
    phase: str
    bucket: int  # with phase "backward": the bucket before whose launch it lost most; else -1
    breakdown: tuple[tuple[str, float], ...]  # (phase, median lateness added there, ns)
    last_step: int
    evidence: str  # "buckets" | "marks" | "forward"
    split_steps: int = 0  # steps whose optimizer-step events split the gap before the forward
    bucket_steps: int = 0  # (evidence "marks") the sampled steps that placed it among buckets
    # its main thread's wait for a CPU a step beyond the others' median (median over the
    # steps with it known, ns; NaN: not known), and those steps
    cpu_wait_ns: float = math.nan
    cpu_wait_steps: int = 0
    # (evidence "marks") steps whose mark says when the rank left the previous all-reduce:
    # the lateness it already had there is not its own (See [Note: lateness it did not add])
    left_steps: int = 0


def _aligned(table: Table, clock: Mapping[int, tuple[int, int]], code: int
             ) -> tuple[np.ndarray, np.ndarray]:
    rows = np.flatnonzero(table.kind == code)
    return table.step[rows], table.t[rows] + clock.get(table.rank, (0, 0))[0]


def _fill(out: np.ndarray, i: int, axis: np.ndarray, steps: np.ndarray, times: np.ndarray,
          t0: int, *, last: bool = False) -> None:
    """out[i, pos(step)] = time, the first (or last) one of each step, for steps on `axis`."""
    if not len(steps):
        return
    if last:
        steps, times = steps[::-1], times[::-1]
    u, first = np.unique(steps, return_index=True)
    pos = np.searchsorted(axis, u)
    ok = pos < len(axis)
    ok[ok] = axis[pos[ok]] == u[ok]
    out[i, pos[ok]] = (times[first[ok]] - t0).astype(np.float64)


def timeline(per_rank: Mapping[int, Table], clock: Mapping[int, tuple[int, int]] | None = None
             ) -> Timeline:
    """The aligned per-step times of every rank (see Timeline); bounded in memory by
    MAX_STEPS and MAX_CELLS (the latest steps are kept)."""
    clock = clock or {}
    ranks = np.array(sorted(r for r, t in per_rank.items() if len(t)), dtype=np.int64)
    tables = [per_rank[int(r)] for r in ranks]
    fwd = [_aligned(t, clock, col.FORWARD) for t in tables]
    bwd = [_aligned(t, clock, col.BACKWARD) for t in tables]
    end = [_aligned(t, clock, col.BACKWARD_END) for t in tables]
    opt = [_aligned(t, clock, col.OPTIMIZER) for t in tables]
    opt_end = [_aligned(t, clock, col.OPTIMIZER_END) for t in tables]
    computed, first_grad, first_param, cpu_wait, left = [], [], -1, [], []
    for t in tables:
        rows = np.flatnonzero(t.kind == col.COMPUTED)
        off = clock.get(t.rank, (0, 0))[0]
        computed.append((t.step[rows], t.t[rows] + off))
        first_grad.append((t.step[rows], t.b[rows] + off))
        cpu_wait.append(_known(t, rows, "cpu_wait_ns"))
        steps_left, t_left = _known(t, rows, "left_prev_ns")
        left.append((steps_left, t_left + off))
        if len(rows) and first_param < 0:
            first_param = int(t.a[rows[-1]])
    launches = []
    for t in tables:
        rows = np.flatnonzero(t.kind == col.LAUNCHED)
        if not len(rows):
            rows = np.flatnonzero(t.kind == col.BUCKET_READY)
        off = clock.get(t.rank, (0, 0))[0]
        launches.append((t.step[rows], t.a[rows], t.t[rows] + off))
    mins = [int(tt.min()) for _, tt in fwd + bwd + end + opt + opt_end + first_grad
            if len(tt)]
    mins += [int(tt.min()) for _, _, tt in launches if len(tt)]
    t0 = min(mins, default=0)

    all_steps = np.unique(np.concatenate([s for s, _ in fwd] or [np.zeros(0, np.int64)]))
    steps = all_steps[all_steps >= 0][-MAX_STEPS:]
    n_r = len(ranks)
    grids = [np.full((n_r, len(steps)), np.nan) for _ in range(9)]
    for i in range(n_r):
        _fill(grids[0], i, steps, *fwd[i], t0)
        _fill(grids[1], i, steps, *bwd[i], t0)
        _fill(grids[2], i, steps, *end[i], t0, last=True)
        _fill(grids[3], i, steps, *opt[i], t0)
        _fill(grids[4], i, steps, *opt_end[i], t0, last=True)
        _fill(grids[5], i, steps, *computed[i], t0)
        _fill(grids[6], i, steps, *first_grad[i], t0)
        _fill(grids[7], i, steps, *cpu_wait[i], 0)
        _fill(grids[8], i, steps, *left[i], t0)

    b_steps = np.unique(np.concatenate([s for s, _, _ in launches] or [np.zeros(0, np.int64)]))
    b_steps = b_steps[b_steps >= 0]
    bucket_ids = np.unique(np.concatenate(
        [b[(s >= 0)] for s, b, _ in launches] or [np.zeros(0, np.int64)]))
    per_step = max(1, n_r * max(1, len(bucket_ids)))
    b_steps = b_steps[len(b_steps) - min(len(b_steps), MAX_STEPS, MAX_CELLS // per_step):]
    if n_r * len(bucket_ids) > MAX_CELLS:
        b_steps = b_steps[:0]
    cube = np.full((n_r, len(b_steps), len(bucket_ids)), np.nan)
    for i, (s, b, tt) in enumerate(launches):
        if not len(b_steps) or not len(s):
            continue
        ps = np.searchsorted(b_steps, s)
        ok = ps < len(b_steps)
        ok[ok] = b_steps[ps[ok]] == s[ok]
        pb = np.searchsorted(bucket_ids, b[ok])
        cube[i, ps[ok], pb] = (tt[ok] - t0).astype(np.float64)

    stated = np.array([_stated_error(clock.get(int(r), (0, 0))[1]) for r in ranks],
                      dtype=np.float64)
    return Timeline(ranks, steps, grids[0], grids[1], grids[2], grids[3], grids[4], b_steps,
                    bucket_ids, cube, stated, _clock_error(stated, grids[2], grids[8]), t0,
                    grids[5], grids[6], first_param, grids[7], grids[8])


def _known(table: Table, rows: np.ndarray, field: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of `field` of the BackwardComputed rows that know it (-1: unknown)."""
    steps, values = [], []
    for row in rows.tolist():
        value = getattr(table.objects.get(row), field, -1)
        if value >= 0:
            steps.append(int(table.step[row]))
            values.append(value)
    return np.array(steps, dtype=np.int64), np.array(values, dtype=np.int64)


def _clock_error(stated: np.ndarray, end: np.ndarray, left: np.ndarray | None) -> np.ndarray:
    """Per rank: the larger of its stated clock error and the skew of its ends of backward and
    of its exits from the last all-reduce (every rank leaves both together, so a steady skew
    there is clock error, or lateness no rank's own work added)."""
    skew = _end_skew(end) if left is None else np.maximum(_end_skew(end), _end_skew(left))
    return np.maximum(stated, skew)


def _stated_error(error: int) -> float:
    return float(UNKNOWN_CLOCK_ERROR_NS if error < 0 else error)


def _end_skew(end: np.ndarray) -> np.ndarray:
    """Per rank: |median over steps of (its end of backward - the ranks' median)|."""
    full = end[:, ~np.isnan(end).any(axis=0)] if end.size else end
    if full.shape[0] < 2 or full.shape[1] == 0:
        return np.zeros(end.shape[0])
    return np.abs(np.median(full - np.median(full, axis=0), axis=1))


def bucket_waits(tl: Timeline) -> Waits:
    """For each recorded step and bucket that every rank launched: the rank launched last
    and how long after the one before it (attributed to nobody within the clock
    uncertainty of the two)."""
    cube = tl.launch
    n_r, n_s, n_b = cube.shape
    if n_r < 2 or not n_s or not n_b:
        empty = np.zeros((n_s, n_b))
        return Waits(tl, np.full((n_s, n_b), -1, np.int64), empty, empty.astype(bool))
    valid = ~np.isnan(cube).any(axis=0)
    filled = np.where(np.isnan(cube), -np.inf, cube)
    order = np.argsort(filled, axis=0, kind="stable")
    last, second = order[-1], order[-2]
    t_last = np.take_along_axis(filled, last[None], 0)[0]
    t_second = np.take_along_axis(filled, second[None], 0)[0]
    with np.errstate(invalid="ignore"):  # -inf - -inf where a rank launched nothing
        wait = np.where(valid, t_last - t_second, 0.0)
    sure = valid & (wait > tl.error_ns[last] + tl.error_ns[second])
    return Waits(tl, np.where(sure, last, -1), np.where(sure, wait, 0.0), valid & ~sure)


def fold(waits: Waits) -> WaitFold:
    """The rank x bucket table of `waits`: how often and how long each rank made each
    bucket's all-reduce wait."""
    tl = waits.timeline
    n_r, n_b = len(tl.ranks), len(tl.buckets)
    who = waits.last.ravel()
    bucket = np.broadcast_to(np.arange(n_b), waits.last.shape).ravel()
    hit = who >= 0
    flat = who[hit] * n_b + bucket[hit]
    count = np.bincount(flat, minlength=n_r * n_b).reshape(n_r, n_b)
    total = np.bincount(flat, weights=waits.wait_ns.ravel()[hit],
                        minlength=n_r * n_b).reshape(n_r, n_b)
    any_valid = (waits.last >= 0) | waits.unsure
    return WaitFold(tuple(int(r) for r in tl.ranks), tuple(int(b) for b in tl.buckets),
                    count, total, int(any_valid.any(axis=1).sum()) if any_valid.size else 0,
                    int(waits.unsure.sum()),
                    int(tl.error_ns.max()) if len(tl.error_ns) else 0)


def who_waited(per_rank: Mapping[int, Table],
               clock: Mapping[int, tuple[int, int]] | None = None) -> WaitFold:
    """`fold(bucket_waits(timeline(...)))`: the rank x bucket "who made the all-reduce wait"."""
    return fold(bucket_waits(timeline(per_rank, clock)))


# --- the verdict ------------------------------------------------------------------------------


def _binom_sf(m: int, n: int, p: float) -> float:
    """P(X >= m) for X ~ Binomial(n, p), in log space (n up to thousands)."""
    if m <= 0:
        return 1.0
    if p >= 1.0:
        return 1.0
    total = 0.0
    lp, lq = math.log(p), math.log1p(-p)
    for k in range(m, n + 1):
        total += math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
                          + k * lp + (n - k) * lq)
    return min(1.0, total)


def _lateness(t: np.ndarray) -> np.ndarray:
    """(R, S) times -> each rank's time minus the latest other rank's (columns complete)."""
    order = np.argsort(t, axis=0)
    top = np.take_along_axis(t, order[-1][None], 0)[0]
    second = np.take_along_axis(t, order[-2][None], 0)[0]
    others = np.where(np.arange(t.shape[0])[:, None] == order[-1][None], second, top)
    return t - others


def _step_time(tl: Timeline) -> float:
    """Median time between consecutive forwards (median over ranks), NaN when unknown."""
    f = tl.forward
    if f.shape[1] < 2:
        return math.nan
    consecutive = np.diff(tl.steps) == 1
    d = np.diff(f, axis=1)[:, consecutive]
    d = d[:, ~np.isnan(d).any(axis=0)] if d.size else d
    return float(np.median(np.median(d, axis=0))) if d.size else math.nan


def _verdict(t: np.ndarray, steps: np.ndarray, tl: Timeline, step_time: float,
             steady: float = 0.0) -> tuple[int, int, int, np.ndarray, float, float] | None:
    """(rank index, steps, last in, x_k, threshold, error) when [Note: straggler verdict]
    names a rank in the complete columns of `t`; else None. `steady`: the share of the steps
    in which k must be later than the others' median by more than the threshold (the
    backward marks: See [Note: straggler verdict])."""
    keep = ~np.isnan(t).any(axis=0)
    t, steps = t[:, keep], steps[keep]
    n_r, n = t.shape
    if n_r < 2 or n < MIN_STEPS:
        return None
    x = _lateness(t)
    k = int(np.bincount(np.argmax(t, axis=0), minlength=n_r).argmax())
    error = float(tl.error_ns[k] + np.max(np.delete(tl.error_ns, k)))
    threshold = max(error, MIN_SHARE * step_time if step_time == step_time else 0.0)
    xk = x[k]
    m = int((xk > error).sum())
    typical = t[k] - np.median(np.delete(t, k, axis=0), axis=0)
    if (4 * m < n or float(np.median(typical)) <= threshold
            or _binom_sf(int((typical > error).sum()), n, 0.5) > P_STEADY
            or _binom_sf(m, n, 1.0 / n_r) > P_MAX
            or float(np.mean(typical > threshold)) < steady):
        return None
    return k, n, m, xk, threshold, error


def _aligned_forwards(tl: Timeline) -> np.ndarray:
    """The forwards that can show a rank late: where the step before ended in an all-reduce
    on every rank (its BackwardComputed, recorded on synced steps only), which made the ranks
    leave it together. A forward after a no_sync micro-step is not a meeting point: the ranks
    drift apart until the next synced backward, and counting each micro-step's forward counts
    one drift several times. Without marks (every=never, old traces) every forward counts."""
    if tl.computed is None or np.isnan(tl.computed).all():
        return tl.forward
    synced = ~np.isnan(tl.computed).any(axis=0)  # (S,)
    after = np.zeros(len(tl.steps), dtype=bool)
    after[1:] = synced[:-1] & (np.diff(tl.steps) == 1)
    return np.where(after[None], tl.forward, np.nan)


def _median_others(a: np.ndarray, k: int) -> np.ndarray:
    others = np.delete(a, k, axis=0)
    with np.errstate(all="ignore"):
        return np.median(others, axis=0)  # NaN where a rank did not record it


def _nanmedian(a: np.ndarray) -> float:
    a = a[~np.isnan(a)]
    return float(np.median(a)) if len(a) else math.nan


def _gap_split(tl: Timeline, k: int) -> tuple[tuple[tuple[str, float], ...], int]:
    """Rank k's (index) lateness added between a backward's end and the next forward, split
    on the optimizer-step events (See [Note: straggler verdict]): ((after_backward, x),
    (optimizer, x), (data, x)) medians, and the number of steps they come from; ((), 0)
    when fewer than MIN_SPLIT_STEPS steps have them on every rank."""
    if not tl.steps.size or np.isnan(tl.optimizer).all():
        return (), 0
    following = np.searchsorted(tl.steps, tl.steps + 1)
    has = following < len(tl.steps)
    has[has] = tl.steps[following[has]] == tl.steps[has] + 1
    next_forward = np.full_like(tl.forward, np.nan)
    next_forward[:, has] = tl.forward[:, following[has]]

    def late(a: np.ndarray) -> np.ndarray:
        return a[k] - _median_others(a, k)

    at_end, at_opt, at_opt_end, at_next = (late(a) for a in (
        tl.end, tl.optimizer, tl.optimizer_end, next_forward))
    ok = ~(np.isnan(at_end) | np.isnan(at_opt) | np.isnan(at_opt_end) | np.isnan(at_next))
    n = int(ok.sum())
    if n < MIN_SPLIT_STEPS:
        return (), 0
    return ((("after_backward", float(np.median((at_opt - at_end)[ok]))),
             ("optimizer", float(np.median((at_opt_end - at_opt)[ok]))),
             ("data", float(np.median((at_next - at_opt_end)[ok])))), n)


def _split_data(parts: list[tuple[str, float]], split: tuple[tuple[str, float], ...]
                ) -> list[tuple[str, float]]:
    """`parts` with its one "data" part replaced by the split of the gap, when there is one."""
    if not split:
        return parts
    return [q for p in parts for q in (split if p[0] == "data" else (p,))]


def _breakdown(tl: Timeline, k: int, b_cols: np.ndarray,
               split: tuple[tuple[str, float], ...] = ()) -> tuple[
        str, int, tuple[tuple[str, float], ...]]:
    """Where rank k (index) adds its lateness on the bucket steps `b_cols` (bool over
    tl.bucket_steps): the phase with the largest median increase, the bucket of the largest
    increase inside the backward; `split`: the gap before the forward split on the optimizer
    step (`_gap_split`), which then stands for its "data" part."""
    pos = np.searchsorted(tl.steps, tl.bucket_steps[b_cols])
    ok = (pos < len(tl.steps))
    ok[ok] = tl.steps[pos[ok]] == tl.bucket_steps[b_cols][ok]
    cube = tl.launch[:, b_cols][:, ok]
    pos = pos[ok]

    def late(a: np.ndarray) -> np.ndarray:
        return a[k] - _median_others(a, k)

    d_f = late(tl.forward[:, pos])
    d_b = late(tl.backward[:, pos])
    d_l = np.stack([late(cube[:, :, j]) for j in range(cube.shape[2])], axis=1) \
        if cube.shape[2] else np.zeros((len(pos), 0))
    # k's lateness at the last bucket it launched in each step (buckets launch in order)
    d_end = d_f
    if cube.shape[2]:
        launched = ~np.isnan(cube[k])  # (steps, buckets)
        last_b = cube.shape[2] - 1 - np.argmax(launched[:, ::-1], axis=1)
        d_end = np.where(launched.any(axis=1), d_l[np.arange(len(last_b)), last_b], np.nan)
    data = _nanmedian(d_f)
    if np.isnan(d_b).all():
        compute = _nanmedian(d_end - d_f)
        parts: list[tuple[str, float]] = [("data", data), ("compute", compute)]
        bucket = -1
    else:
        parts = [("data", data), ("forward", _nanmedian(d_b - d_f)),
                 ("backward", _nanmedian(d_end - d_b))]
        prev = d_b
        incs = []
        for j in range(d_l.shape[1]):
            cur = d_l[:, j]
            inc = cur - prev
            incs.append(_nanmedian(inc))
            prev = np.where(np.isnan(cur), prev, cur)
        bucket = -1
        total = parts[-1][1]
        if incs and not all(math.isnan(i) for i in incs):
            j = int(np.nanargmax(incs))
            # one bucket only when most of the backward's lateness is added before it
            if total == total and incs[j] >= 0.5 * total:
                bucket = int(tl.buckets[j])
    parts = [(p, v if v == v else 0.0) for p, v in _split_data(parts, split)]
    phase = max(parts, key=lambda pv: pv[1])[0]
    return phase, (bucket if phase == "backward" else -1), tuple(parts)


def _mark_breakdown(tl: Timeline, k: int, cols: np.ndarray,
                    split: tuple[tuple[str, float], ...] = ()) -> tuple[
        str, int, tuple[tuple[str, float], ...], int, int]:
    """Where rank k (index) adds its lateness on the marked steps `cols` (bool over
    tl.steps): before the forward (from leaving the last all-reduce, where the marks say when
    on MIN_SPLIT_STEPS steps: the lateness it had there is not its own), between the forward
    and its first gradient, and between its first gradient and the end of its backward;
    within the backward, the bucket the sampled steps' launches name (`_breakdown`, on at
    least MIN_BUCKET_STEPS of them that also say "backward"), how many steps that is, and
    how many steps timed the exit from the last all-reduce."""
    assert tl.computed is not None and tl.first_grad is not None

    def late(a: np.ndarray) -> np.ndarray:
        return a[k] - _median_others(a, k)

    d_f, d_g, d_c = (late(a[:, cols]) for a in (tl.forward, tl.first_grad, tl.computed))
    d_data, n_left = d_f, 0
    if tl.left is not None:
        d_l = late(tl.left[:, cols])
        known = ~np.isnan(d_l) & ~np.isnan(d_f)
        if int(known.sum()) >= MIN_SPLIT_STEPS:
            d_data, n_left = (d_f - d_l)[known], int(known.sum())
    parts = [("data", _nanmedian(d_data)), ("to_first_grad", _nanmedian(d_g - d_f)),
             ("backward", _nanmedian(d_c - d_g))]
    parts = [(p, v if v == v else 0.0) for p, v in _split_data(parts, split)]
    phase = max(parts, key=lambda pv: pv[1])[0]
    bucket, n_bucket = -1, 0
    if phase == "backward" and tl.launch.size:
        b_cols = ~np.isnan(tl.launch).any(axis=(0, 2))
        if int(b_cols.sum()) >= MIN_BUCKET_STEPS:
            sampled_phase, bucket, _ = _breakdown(tl, k, b_cols)
            if sampled_phase == "backward":  # (bucket -1: spread over the buckets)
                n_bucket = int(b_cols.sum())
    return phase, bucket, tuple(parts), n_bucket, n_left


def find_straggler(tl: Timeline) -> Straggler | None:
    """The rank that is persistently last, per [Note: straggler verdict], or None (also when
    its own phases do not explain its lateness: See [Note: lateness it did not add])."""
    s = _last_rank(tl)
    if s is None or ((s.split_steps or s.left_steps) and _own_ns(s) < s.threshold_ns):
        return None
    wait, n = _cpu_excess(tl, int(np.flatnonzero(tl.ranks == s.rank)[0]))
    return s._replace(cpu_wait_ns=wait, cpu_wait_steps=n)


def _cpu_excess(tl: Timeline, k: int) -> tuple[float, int]:
    """Rank index k's wait for a CPU a step beyond the other ranks' median (median over the
    consecutive steps where every rank's is known, ns) and those steps; (NaN, 0) unknown."""
    if tl.cpu_wait is None:
        return math.nan, 0
    d = np.diff(tl.cpu_wait, axis=1)[:, np.diff(tl.steps) == 1]
    d = d[:, ~np.isnan(d).any(axis=0)] if d.size else d
    if d.shape[1] < MIN_STEPS:
        return math.nan, 0
    excess = d[k] - np.median(np.delete(d, k, axis=0), axis=0)
    return float(np.median(excess)), int(d.shape[1])


def cpu_explained(s: Straggler) -> bool:
    """Whether the straggler's wait for a CPU accounts for at least half of its lateness (the
    wait it caused a step, and never less than the threshold it was named by): its host's load,
    not its own work. See [Note: waiting for a CPU] in probes/cpu_wait.py."""
    late = max(s.median_ns, s.threshold_ns)
    return s.cpu_wait_ns == s.cpu_wait_ns and s.cpu_wait_ns > 0 and 2 * s.cpu_wait_ns >= late


def _own_ns(s: Straggler) -> float:
    """The lateness rank s added in its own phases (the positive medians of the breakdown)."""
    return sum(v for _, v in s.breakdown if v > 0)


def before(tl: Timeline, step: int) -> Timeline:
    """`tl` with the steps from `step` on not recorded (NaN)."""
    late = tl.steps >= step

    def cut(a: np.ndarray) -> np.ndarray:
        return np.where(late[None], np.nan, a)

    end = cut(tl.end)
    return tl._replace(
        forward=cut(tl.forward), backward=cut(tl.backward), end=end,
        optimizer=cut(tl.optimizer), optimizer_end=cut(tl.optimizer_end),
        computed=None if tl.computed is None else cut(tl.computed),
        first_grad=None if tl.first_grad is None else cut(tl.first_grad),
        cpu_wait=None if tl.cpu_wait is None else cut(tl.cpu_wait),
        left=None if tl.left is None else cut(tl.left),
        launch=np.where((tl.bucket_steps >= step)[None, :, None], np.nan, tl.launch),
        error_ns=_clock_error(tl.stated_error_ns, end, tl.left))


def _last_rank(tl: Timeline) -> Straggler | None:
    if len(tl.ranks) < 2:
        return None
    step_time = _step_time(tl)
    waits = bucket_waits(tl)
    complete = (waits.last >= 0) | waits.unsure  # (Sb, B) every rank launched
    if complete.size:
        ends = np.where(complete[None], tl.launch, -np.inf).max(axis=2)
        ends = np.where(np.isinf(ends), np.nan, ends)
        got = _verdict(ends, tl.bucket_steps, tl, step_time)
        if got is not None:
            k, n, m, xk, threshold, error = got
            cols = np.asarray(~np.isnan(ends).any(axis=0))
            split, n_split = _gap_split(tl, k)
            phase, bucket, parts = _breakdown(tl, k, cols, split)
            cost = np.clip(xk, 0, None)
            return Straggler(int(tl.ranks[k]), n, m, float(np.median(cost)),
                             float(np.percentile(cost, 90)), threshold, error, phase, bucket,
                             parts, int(tl.bucket_steps[cols][-1]), "buckets",
                             n_split)
    if tl.computed is not None and not np.isnan(tl.computed).all():
        marked = np.where(np.isnan(tl.forward) | np.isnan(tl.first_grad), np.nan,
                          tl.computed) if tl.first_grad is not None else tl.computed
        got = _verdict(marked, tl.steps, tl, step_time, MARK_STEADY)
        if got is not None:
            k, n, m, xk, threshold, error = got
            cols = np.asarray(~np.isnan(marked).any(axis=0))
            split, n_split = _gap_split(tl, k)
            phase, bucket, parts, n_bucket, n_left = _mark_breakdown(tl, k, cols, split)
            cost = np.clip(xk, 0, None)
            return Straggler(int(tl.ranks[k]), n, m, float(np.median(cost)),
                             float(np.percentile(cost, 90)), threshold, error, phase, bucket,
                             parts, int(tl.steps[cols][-1]), "marks", n_split, n_bucket,
                             left_steps=n_left)
    forward = _aligned_forwards(tl)
    got = _verdict(forward, tl.steps, tl, step_time)
    if got is None:
        return None
    k, n, m, xk, threshold, error = got
    cost = np.clip(xk, 0, None)
    cols = np.asarray(~np.isnan(forward).any(axis=0))
    split, n_split = _gap_split(tl, k)
    gap = _split_data([("data", float(np.median(xk)))], split)
    return Straggler(int(tl.ranks[k]), n, m, float(np.median(cost)),
                     float(np.percentile(cost, 90)), threshold, error,
                     max(gap, key=lambda pv: pv[1])[0], -1, tuple(gap),
                     int(tl.steps[cols][-1]), "forward", n_split)


_PHASE_TEXT = {
    "data": "before the forward (data loading, or the optimizer step after the previous "
            "backward)",
    "forward": "in the forward",
    "backward": "in the backward",
    "compute": "in the forward or backward",
}
# With the optimizer step recorded, the gap before the forward is three phases.
_SPLIT_TEXT = {
    **_PHASE_TEXT,
    "after_backward": "after the backward, before the optimizer step (gradient clipping, "
                      "logging, a host sync such as loss.item())",
    "optimizer": "in the optimizer step (after the backward)",
    "data": "in data loading (before the forward, after the optimizer step)",
}


# From the backward marks (every step: See [Note: backward marks]), the backward is two phases.
_MARK_TEXT = {
    "to_first_grad": "in the forward or its backward before the first gradient ({first})",
    "backward": "in the backward, between its first gradient ({first}) and its end",
}


def _clock_text(tl: Timeline, k: int, error_ns: float) -> str:
    """The alignment's uncertainty in words: the clock offsets' own error and the skew at the
    end of backward (which every rank leaves together) that widened it."""
    stated = tl.stated_error_ns
    if not stated.any():
        how = "clock offsets exact (one host: a shared monotonic clock)"
    elif (stated >= UNKNOWN_CLOCK_ERROR_NS).any():
        how = f"clock offsets from wall clocks only (NTP's error assumed: +-{ms(stated.max())})"
    else:
        how = f"clock offsets measured to +-{ms(stated.max())}"
    return (f"{how}; uncertainty of rank {int(tl.ranks[k])} against the others "
            f"+-{ms(error_ns)} (clock error, or how far the ranks' ends of backward, which the "
            "last all-reduce makes simultaneous, sit apart: whichever is larger)")


def straggler_findings(per_rank: Mapping[int, Table],
                       clock: Mapping[int, tuple[int, int]] | None = None,
                       world_size: int = 0,
                       names: Mapping[int, Mapping[int, str]] | None = None,
                       bucket_params: Mapping[int, Sequence[int]] | None = None,
                       timeline_: Timeline | None = None,
                       nonfinite_step: int | None = None) -> list[Finding]:
    """The `straggler` finding, when one rank is persistently last (else nothing);
    `names` ({rank: {param: dotted name}}) and `bucket_params` (bucket -> params) name the
    bucket's parameters (read from the tables when not given); `timeline_`: the timeline of
    these tables when the caller has it already; `nonfinite_step`: the first step a
    non-finite value was found at (that step and later ones are not read: See [Note:
    lateness it did not add])."""
    tl = timeline(per_rank, clock) if timeline_ is None else timeline_
    if nonfinite_step is not None:
        tl = before(tl, nonfinite_step)
    s = find_straggler(tl)
    if s is None:
        return []
    texts = dict(_SPLIT_TEXT if s.split_steps else _PHASE_TEXT)
    own = (names or {}).get(s.rank) or _param_names(per_rank.get(s.rank))
    if s.evidence == "marks":
        first = own.get(tl.first_param, f"#{tl.first_param}") if tl.first_param >= 0 else "?"
        texts.update({p: t.format(first=first) for p, t in _MARK_TEXT.items()})
    where = texts[s.phase]
    if s.phase == "backward" and s.bucket < 0 and (s.evidence == "buckets" or s.bucket_steps):
        where += ", spread over its buckets"
    if s.bucket >= 0:
        where += f", most of it before bucket {s.bucket} launched"
        members = (bucket_members(per_rank) if bucket_params is None
                   else bucket_params).get(s.bucket, ())
        shown = [own.get(i, f"#{i}") for i in members[:3]]
        if shown:
            where += f" ({', '.join(shown)}{', ...' if len(members) > 3 else ''})"
    if s.bucket_steps and s.phase == "backward":
        where += f" (the {s.bucket_steps} sampled steps with per-bucket events)"
    what = {"buckets": "the step's last all-reduce waited for it",
            "marks": "its backward ended last (the step's last all-reduce waited for it)",
            }.get(s.evidence, "the other ranks (at the forward) waited for it")
    title = (f"rank {s.rank} is the straggler: {what} in {s.last_in} of "
             f"{s.steps} recorded steps, {ms(s.median_ns)} median, {ms(s.p90_ns)} p90 a step")
    parts = ", ".join(f"{texts[p].split(' (')[0]} {'+' if v >= 0 else ''}{ms(v)}"
                      for p, v in s.breakdown)
    split = (f"; the optimizer step told from data loading on the {s.split_steps} steps "
             "that recorded it" if s.split_steps else "")
    if nonfinite_step is not None:
        split += (f"; steps from {nonfinite_step} on, after the first non-finite value, "
                  "not counted")
    contended = cpu_explained(s)
    cpu = _cpu_text(s, contended)
    if contended:
        title = (f"rank {s.rank} is slower because it waits for a CPU: its main thread waited "
                 f"{ms(s.cpu_wait_ns)} a step longer than the other ranks' to be run, and "
                 f"{what} in {s.last_in} of {s.steps} recorded steps ({ms(s.median_ns)} "
                 "median): the CPUs it runs on are busy with other work")
    detail = (*((cpu,) if cpu else ()),
              f"it loses the time {where}",
              f"median lateness against the other ranks: {parts}",
              f"{_clock_text(tl, int(np.flatnonzero(tl.ranks == s.rank)[0]), s.error_ns)}",
              f"named when slower than the other ranks' median by more than "
              f"{ms(s.threshold_ns)} (the uncertainty or {MIN_SHARE:.0%} of the step, "
              "whichever is larger) and last far more often than chance",
              f"from the {_EVIDENCE[s.evidence]} events of steps up to {s.last_step}{split}")
    return [Finding(kind="straggler", severity="info" if contended else "warning", title=title,
                    ranks=(s.rank,), field="cpu_wait" if contended else s.phase,
                    bucket=s.bucket, step=s.last_step,
                    values=((f"last in {s.last_in}/{s.steps} steps, waited for "
                             f"{ms(s.median_ns)} median", (s.rank,)),),
                    detail=detail, fix=fix_for("straggler", "cpu_wait" if contended else
                                               "data_loading" if s.split_steps
                                               and s.phase == "data" else s.phase),
                    world_size=world_size)]


def _cpu_text(s: Straggler, contended: bool) -> str:
    """What the straggler's wait for a CPU says, where it was read ('' where not);
    `contended`: `cpu_explained(s)`."""
    if s.cpu_wait_ns != s.cpu_wait_ns:
        return ""
    how = ("at least half of its lateness: the time is lost to other processes or threads "
           "on its host (a CPU hog, more DataLoader workers or OpenMP threads than cores), "
           "not in the job's own work" if contended else
           "less than half of its lateness: waiting for a CPU does not explain the rest "
           "(something in this rank's process is slower: the job's own work, or ddpviz's)")
    return (f"its main thread waited {ms(s.cpu_wait_ns)} a step longer for a CPU than the "
            f"other ranks' (the kernel's run-queue delay, median over {s.cpu_wait_steps} "
            f"steps): {how}")


_EVIDENCE = {"buckets": "per-bucket", "marks": "per-step backward (BackwardComputed)",
             "forward": "forward"}


def _param_names(table: Table | None) -> dict[int, str]:
    """param index -> dotted name, from a rank's latest ParamsBuilt."""
    built = table.rare(ev.ParamsBuilt) if table is not None else []
    return {p.index: p.name for p in built[-1].params} if built else {}


def bucket_members(per_rank: Mapping[int, Table]) -> dict[int, tuple[int, ...]]:
    """bucket -> its parameter indices in the latest BucketAssigned of the lowest rank."""
    for _, t in sorted(per_rank.items()):
        maps = t.rare(ev.BucketAssigned)
        if maps:
            return {b: tuple(p) for b, p in enumerate(maps[-1].buckets)}
    return {}


MANY_RANKS = 16  # above this, the rank x bucket view shows the top ranks and one "others" row
TOP_RANKS = 8


class WaitRow(NamedTuple):
    label: str  # "rank 3" or "other ranks 0-2, 4-63"
    ranks: tuple[int, ...]
    n_last: tuple[int, ...]  # per bucket: steps in which these ranks made it wait
    wait_ns: tuple[float, ...]  # per bucket: total wait they caused


def wait_rows(table: WaitFold, many: int = MANY_RANKS, top: int = TOP_RANKS) -> list[WaitRow]:
    """The rows of the rank x bucket view: one per rank up to `many` ranks; above, the `top`
    ranks that caused the most wait, then every other rank folded into one row (what the
    dashboard and the viewer draw)."""
    label = format_ranks
    n_r = len(table.ranks)
    totals = table.wait_ns.sum(axis=1) if n_r else np.zeros(0)
    if n_r <= many:
        keep = list(range(n_r))
        rest: list[int] = []
    else:
        order = np.argsort(-totals, kind="stable")
        keep = sorted(int(i) for i in order[:top] if totals[i] > 0)
        rest = sorted(set(range(n_r)) - set(keep))
    rows = [WaitRow(label((table.ranks[i],)), (table.ranks[i],),
                    tuple(int(c) for c in table.n_last[i]),
                    tuple(float(x) for x in table.wait_ns[i])) for i in keep]
    if rest:
        ranks = tuple(table.ranks[i] for i in rest)
        rows.append(WaitRow("other " + label(ranks), ranks,
                            tuple(int(c) for c in table.n_last[rest].sum(axis=0)),
                            tuple(float(x) for x in table.wait_ns[rest].sum(axis=0))))
    return rows
