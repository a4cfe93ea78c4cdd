"""Who is slow, at fleet scale: how many steps until a slowed rank is named, and how long the
analysis takes, on simulated traces of N ranks (tests/diagnose/test_straggler.py runs the
same simulator with assertions on the verdict, never on the times).

A simulated step of every rank, in the time DDP's all-reduces impose (all ranks leave the
backward together, when the last bucket's all-reduce is done):

    gap (data loading + optimizer)  ForwardStarted  forward  BackwardStarted
    per bucket: gradient compute, BucketReady + AllReduceLaunched
    all-reduce b starts when the last rank launched it (and b-1 is done), takes `comm`
    BackwardFinished on every rank when the last one is done (+ a few us of skew)

Each phase of each rank and step is drawn with multiplicative noise (lognormal, sigma
`jitter`) and, with probability `spikes`, a 1.5-3x stall (a loaded machine's preemption);
the slow rank's chosen phase takes `slow` times longer. `every`: per-bucket and backward
events only on the steps watch's default level samples (0-2 and every `every`-th; the rest
record only the ForwardStarted), 1: every step (the guard). `optimizer`: the gap is after the
backward (10%), the optimizer step (40%) and data loading (50%), and a sampled step records
its optimizer step (OptimizerStepStarted/Finished, stamped with that step) in the next gap;
the slow phase may then be "optimizer" ("data" slows data loading only). `marks`: every step
records a BackwardComputed (watch's hook-less default: the end of the rank's own backward,
before the wait, and its first gradient, when its backward began; See [Note: backward
marks] in ddpviz/probes/backward_marks.py).

    python benchmarks/bench_straggler.py [--ranks 2,64,256] [--steps 40] [--buckets 25]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddpviz import events as ev
from ddpviz._diagnose.diagnosis import diagnose_tables
from ddpviz._diagnose.straggler import find_straggler, timeline
from ddpviz.traces.columns import RankColumns, Table

MS = 1_000_000


class Sim(NamedTuple):
    tables: dict[int, Table]
    events: int


def simulate(ranks: int, steps: int, *, slow_rank: int = -1, slow: float = 1.2,
             phase: str = "backward", jitter: float = 0.05, spikes: float = 0.0,
             buckets: int = 8, every: int = 1, seed: int = 0, step_ms: float = 100.0,
             clock_skew_ns: int = 0, optimizer: bool = False, marks: bool = False,
             exit_lag_rank: int = -1, exit_lag_ms: float = 0.0,
             exit_lag_swapped: tuple[int, ...] = (), left: bool = False) -> Sim:
    """Columns of a simulated run (see the module docstring). Phase shares of a step: gap
    15%, forward 25%, backward compute 45% (spread over the buckets), communication 15%.
    `clock_skew_ns`: every rank's recorded times shifted by a constant in
    [-skew, +skew] (an offset error, as across hosts). `exit_lag_rank` leaves every
    all-reduce `exit_lag_ms` after the others and starts its next step that much later, with
    every phase of its own as long as theirs (a busy host: See [Note: lateness it did not
    add] in ddpviz/_diagnose/straggler.py); at the steps `exit_lag_swapped` the next rank
    lags instead (which rank leaves first flips now and then on a real busy host). `left`:
    the marks say when each rank left the previous step's all-reduces (`left_prev_ns`)."""
    rng = np.random.default_rng(seed)
    gap, fwd, bwd, comm = (step_ms * MS * f for f in (0.15, 0.25, 0.45, 0.15))
    per_bucket = bwd / buckets

    def draw(shape: tuple[int, ...], mean: float) -> np.ndarray:
        x = mean * rng.lognormal(-jitter ** 2 / 2, jitter, shape) if jitter else \
            np.full(shape, mean)
        if spikes:
            x = x * np.where(rng.random(shape) < spikes, rng.uniform(1.5, 3.0, shape), 1.0)
        return x

    factor = {p: np.ones(ranks) for p in ("data", "forward", "backward", "optimizer")}
    if slow_rank >= 0:
        factor[phase][slow_rank] = slow
    shift = rng.integers(-clock_skew_ns, clock_skew_ns + 1, ranks) if clock_skew_ns else \
        np.zeros(ranks, dtype=np.int64)
    cols = [RankColumns(r) for r in range(ranks)]
    seqs = [0] * ranks
    n_events = 0
    t: float | np.ndarray = 1_000 * MS
    was_sampled = False
    left_at = np.full(ranks, -1.0)  # when each rank left the previous step (-1: step 0)
    for s in range(steps):
        sampled = every == 1 or s < 3 or s % every == 0
        if optimizer:
            o0 = t + draw((ranks,), 0.1 * gap)
            o1 = o0 + draw((ranks,), 0.4 * gap) * factor["optimizer"]
            f = o1 + draw((ranks,), 0.5 * gap) * factor["data"]
        else:
            f = t + draw((ranks,), gap) * factor["data"]
        b = f + draw((ranks,), fwd) * factor["forward"]
        ready = b[:, None] + np.cumsum(draw((ranks, buckets), per_bucket), axis=1) \
            * factor["backward"][:, None]
        done = 0.0
        for j in range(buckets):
            done = max(float(ready[:, j].max()), done) + comm / buckets
        end = done + rng.uniform(0, 20_000, ranks)
        lagging = -1 if exit_lag_rank < 0 else \
            (exit_lag_rank + (s in exit_lag_swapped)) % ranks
        if lagging >= 0:
            end[lagging] += exit_lag_ms * MS
        for r in range(ranks):
            off = int(shift[r])
            rows: list[tuple[type[ev.Event], float, tuple[object, ...]]] = []
            if optimizer and was_sampled:  # the previous step's, stamped with it (step - 1)
                rows += [(ev.OptimizerStepStarted, o0[r], ()),
                         (ev.OptimizerStepFinished, o1[r], ())]
            rows.append((ev.ForwardStarted, f[r], ()))
            if sampled:
                rows.append((ev.BackwardStarted, b[r], ()))
                for j in range(buckets):
                    rows.append((ev.BucketReady, ready[r, j], (j,)))
                    rows.append((ev.AllReduceLaunched, ready[r, j], (j, 1 << 20, "float32")))
            if marks:
                prev = int(left_at[r]) + off if left and left_at[r] >= 0 else -1
                rows.append((ev.BackwardComputed, ready[r, -1], (0, int(b[r]) + off, -1, prev)))
            if sampled:
                rows += [(ev.AllReduceDone, end[r], (j,)) for j in range(buckets)]
                rows.append((ev.BackwardFinished, end[r], ()))
            out = [cls(r, s - (cls in _PREVIOUS), int(tt) + off, seqs[r] + i,
                       *fields)  # type: ignore[call-arg]
                   for i, (cls, tt, fields) in enumerate(rows)]
            seqs[r] += len(out)
            cols[r].add(out)
            n_events += len(out)
        t = float(end.max())
        if lagging >= 0:  # (the others leave together; the lagging rank later)
            t = np.full(ranks, float(np.delete(end, lagging).max()))
            t[lagging] = end[lagging]
        left_at = np.broadcast_to(t, (ranks,)).astype(np.float64)
        was_sampled = sampled
    return Sim({r: c.table() for r, c in enumerate(cols)}, n_events)


_PREVIOUS = (ev.OptimizerStepStarted, ev.OptimizerStepFinished)  # stamped with step - 1


def prefix(tables: dict[int, Table], steps: int) -> dict[int, Table]:
    """The tables of the first `steps` steps (rows are in step order)."""
    out = {}
    for r, t in tables.items():
        n = int(np.searchsorted(t.step, steps))
        out[r] = Table(r, t.kind[:n], t.step[:n], t.t[:n], t.seq[:n], t.a[:n], t.b[:n],
                       t.s[:n], {}, t.strings)
    return out


def steps_until_named(tables: dict[int, Table], steps: int, rank: int) -> int | None:
    """The number of steps after which the straggler is first named as `rank` (None:
    never, or another rank was named first)."""
    for n in range(1, steps + 1):
        found = find_straggler(timeline(prefix(tables, n)))
        if found is not None:
            return n if found.rank == rank else None
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,64,256")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--buckets", type=int, default=25)
    args = parser.parse_args()
    print(f"{'ranks':>5} {'case':<36} {'named':>8} {'after':>11} {'events':>8} "
          f"{'straggler':>9} {'diagnose':>9}")
    for n in (int(x) for x in args.ranks.split(",")):
        slow = n // 3
        cases: list[tuple[str, int, dict[str, Any]]] = [
            ("backward +20%, guard (every step)", args.steps, dict(slow_rank=slow, every=1)),
            ("backward +20%, jitter 10%", args.steps, dict(slow_rank=slow, every=1,
                                                           jitter=0.1)),
            ("backward +20%, default (every=100)", args.steps, dict(slow_rank=slow, every=100,
                                                                    marks=True)),
            ("backward +20%, every=100, no marks", 410, dict(slow_rank=slow, every=100)),
            ("data x2 (+15% step), default", args.steps, dict(slow_rank=slow, phase="data",
                                                              slow=2.0, every=100, marks=True)),
            ("healthy, jitter 10% + stalls", args.steps, dict(every=1, jitter=0.1,
                                                              spikes=0.05)),
            ("healthy, default, jitter 10% + stalls", args.steps, dict(
                every=100, jitter=0.1, spikes=0.05, marks=True)),
            ("healthy, clock offsets +-1 ms", args.steps, dict(every=1, clock_skew_ns=MS)),
            ("healthy, default, clock offsets +-1 ms", args.steps, dict(
                every=100, clock_skew_ns=MS, marks=True)),
        ]
        for name, steps, kw in cases:
            sim = simulate(n, steps, buckets=args.buckets, **kw)
            t0 = time.perf_counter()
            found = find_straggler(timeline(sim.tables))
            took = time.perf_counter() - t0
            t0 = time.perf_counter()
            diagnose_tables(sim.tables)
            whole = time.perf_counter() - t0
            after = steps_until_named(sim.tables, steps, slow) \
                if kw.get("slow_rank", -1) >= 0 else None
            every = kw.get("every", 1)
            sampled = None if after is None else sum(
                1 for s in range(after) if every == 1 or s < 3 or s % every == 0)
            shown = "-" if after is None else f"{after} ({sampled})"
            named = "-" if found is None else f"rank {found.rank}"
            print(f"{n:>5} {name:<36} {named:>8} {shown:>11} {sim.events:>8} "
                  f"{took * 1e3:>7.1f}ms {whole * 1e3:>7.1f}ms")
    print("after: steps until the slow rank is named (in brackets: those with per-bucket "
          "events); straggler: find_straggler on the whole run; diagnose: every analysis of "
          "diagnose(), straggler included.")

if __name__ == "__main__":
    main()
