"""A simulated fleet into one collector: K processes emit the wire traffic of N ranks.

Each simulated rank has its own real `Sender` (its own socket, buffer and shipping thread, as
a rank has) and a `Tap`; every second (1 step/s per rank, all ranks in step, as DDP's
all-reduces keep them) it emits what ddpviz's DDP emits for one step of a model with P
parameters in B buckets at the given detail level (recording.py's DetailPolicy decides
which steps are full; the rebuild is at step 1):

    ForwardStarted, BackwardStarted, per bucket [P/B GradReady | one GradsSummarized],
    BucketReady, AllReduceLaunched; then B AllReduceDone and BackwardFinished

into ONE collector in this process: the real `Collector` + `Session` with a subscriber
callback. Reported per N and level: events/s delivered, drops (senders' EventsDropped), gaps
(silent loss), emit -> callback latency p50/p95 (one host: both ends read one monotonic
clock), and the clock-alignment error bound the senders measured (half the best ping round
trip: what a rank on another host would get on this link).

    python benchmarks/bench_fleet.py [--ranks 16,64,256] [--levels full,buckets,sampled]
                                     [--steps 12] [--procs 4] [--params 1000] [--buckets 25]

`run_fleet` is also what tests/transport/test_fleet.py runs (N=16, asserting counts).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from array import array
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddpviz import events as ev
from ddpviz.recording import DetailPolicy, parse_level
from ddpviz.session.live import Session
from ddpviz.transport import Collector, Sender


class FleetResult(NamedTuple):
    ranks: int
    level: str
    emitted: int  # events the simulated ranks emitted
    delivered: int  # events the subscriber callback saw (EventsDropped markers excluded)
    dropped: int  # events the senders dropped (counted, reported as EventsDropped)
    gaps: int  # sequence numbers never received and not explained: silent loss
    rejected: int  # messages the collector refused
    lost_frames: int  # messages missing from the senders' frame numbering
    shut: int  # connections the collector shut mid-handshake (over its cap; they reconnect)
    seconds: float  # first emit -> last callback
    rate: float  # delivered events per second over `seconds`
    p50_ms: float  # emit -> callback latency
    p95_ms: float
    clock_error_us: float  # median over ranks of the ping bound (half the best round trip)
    per_rank_step: float  # events per rank and step, averaged over the run
    emit_max_ms: float  # the longest a simulated rank spent emitting one step's events


def step_events(tap: ev.Tap, step: int, full: bool, params: int, buckets: int) -> int:
    """Emit one step of one rank, as the engine would; returns the number of events."""
    per = params // buckets
    nbytes = per * 4 * 64  # 64 floats a parameter
    tap.step = step
    tap.emit(ev.ForwardStarted)
    tap.emit(ev.BackwardStarted)
    n = 2
    for b in range(buckets):
        if full:
            for i in range(per):
                tap.emit(ev.GradReady, b * per + i, b)
            n += per
        else:
            t = time.monotonic_ns()
            tap.emit(ev.GradsSummarized, b, per, t, t, nbytes)
            n += 1
        tap.emit(ev.BucketReady, b)
        tap.emit(ev.AllReduceLaunched, b, nbytes, "float32")
        n += 2
    for b in range(buckets):
        tap.emit(ev.AllReduceDone, b)
    tap.emit(ev.BackwardFinished)
    return n + buckets + 1


def _producer(connect: str, ranks: list[int], level: str, steps: int, params: int,
              buckets: int, start_at: float, step_s: float, capacity: int, out: Any) -> None:
    name, every = parse_level(level, where="--levels ")
    policy = DetailPolicy(name, every)
    policy.note_rebuild(1)
    senders = {r: Sender(connect, r, capacity=capacity) for r in ranks}
    taps = {r: ev.Tap(senders[r], r) for r in ranks}
    emitted = 0
    emit_max = 0.0
    for step in range(steps):
        due = start_at + step * step_s
        delay = due - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        full = policy.full(step)
        for r in ranks:
            t0 = time.perf_counter()
            emitted += step_events(taps[r], step, full, params, buckets)
            emit_max = max(emit_max, time.perf_counter() - t0)
    dropped = 0
    errors = []
    for s in senders.values():
        s.close(120)
        dropped += s.stats.dropped
        best = s._sink._best_error  # type: ignore[attr-defined]
        if best is not None:
            errors.append(best)
    out.put((emitted, dropped, errors, emit_max))


def run_fleet(ranks: int, level: str, *, steps: int = 12, procs: int = 4, params: int = 1000,
              buckets: int = 25, step_s: float = 1.0, timeout: float = 300.0,
              max_pending: int | None = None, capacity: int = 1 << 16,
              consumer_us: float = 0.0) -> FleetResult:
    """Simulate `ranks` ranks in `procs` processes into one Session; see the module doc.
    `capacity`: each sender's buffer (events); `consumer_us`: extra microseconds the
    subscriber spends on each event (a notebook slower than the job)."""
    session = Session(Collector() if max_pending is None else
                      Collector(max_pending=max_pending))
    latencies = array("q")
    seen = [0, 0]  # delivered, last callback time
    now = time.monotonic_ns

    def on_event(e: ev.Event) -> None:
        t = now()
        if type(e) is ev.EventsDropped:
            return
        if consumer_us:
            busy_until = t + int(consumer_us * 1000)
            while now() < busy_until:
                pass
        latencies.append(t - e.t_ns)
        seen[0] += 1
        seen[1] = t

    session.subscribe(on_event)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = min(procs, ranks)
    groups = [list(range(ranks))[i::procs] for i in range(procs)]
    start_at = time.monotonic() + 3.0 + 0.02 * ranks  # time for every sender to connect
    workers = [ctx.Process(target=_producer, args=(session.connect_string, g, level, steps,
                                                   params, buckets, start_at, step_s,
                                                   capacity, q),
                           daemon=True) for g in groups]
    for w in workers:
        w.start()
    try:
        results = [q.get(timeout=timeout) for _ in workers]
    finally:
        for w in workers:
            w.join(10)
            if w.is_alive():
                w.kill()
    emitted = sum(r[0] for r in results)
    dropped = sum(r[1] for r in results)
    errors = sorted(e for r in results for e in r[2])
    session.wait(ranks=ranks, timeout=60)
    deadline = time.monotonic() + 60
    while seen[0] + dropped < emitted and time.monotonic() < deadline:
        time.sleep(0.05)
    stats = session.stats
    session.close()
    if stats.total_rejected:
        print(f"# rejected {stats.rejected}, handshakes failed {stats.handshakes_failed}, "
              f"shut mid-handshake {stats.pending_shut}", file=sys.stderr)
    start_ns = int(start_at * 1e9)
    seconds = max(1e-9, (seen[1] - start_ns) / 1e9)
    lat = sorted(latencies)

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(p * len(lat)))] / 1e6 if lat else float("nan")

    return FleetResult(
        ranks=ranks, level=level, emitted=emitted, delivered=seen[0], dropped=dropped,
        gaps=sum(stats.gaps.values()), rejected=stats.total_rejected,
        lost_frames=sum(stats.lost_frames.values()), shut=stats.pending_shut, seconds=seconds,
        rate=seen[0] / seconds, p50_ms=pct(0.50), p95_ms=pct(0.95),
        clock_error_us=errors[len(errors) // 2] / 1e3 if errors else float("nan"),
        per_rank_step=emitted / (ranks * steps),
        emit_max_ms=max(r[3] for r in results) * 1e3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="16,64,256")
    ap.add_argument("--levels", default="full,buckets,sampled")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--params", type=int, default=1000)
    ap.add_argument("--buckets", type=int, default=25)
    ap.add_argument("--max-pending", type=int, default=None,
                    help="the collector's cap on connections mid-handshake (default: its own)")
    ap.add_argument("--capacity", type=int, default=1 << 16, help="each sender's buffer")
    ap.add_argument("--consumer-us", type=float, default=0.0,
                    help="extra microseconds the subscriber spends per event (a slow notebook)")
    ap.add_argument("--step-s", type=float, default=1.0, help="seconds per step (1: 1 step/s)")
    args = ap.parse_args()
    print(f"# {args.steps} steps at {1 / args.step_s:g} step/s per rank, {args.params} params "
          f"in {args.buckets} buckets, {args.procs} producer processes, one collector; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print("| ranks | detail | events/rank/step | emitted | delivered | events/s | dropped | "
          "gaps | lost msgs | p50 ms | p95 ms | clock bound us | rejected (shut) | "
          "max emit ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.ranks.split(",")):
        for level in args.levels.split(","):
            r = run_fleet(n, level, steps=args.steps, procs=args.procs, params=args.params,
                          buckets=args.buckets, step_s=args.step_s,
                          max_pending=args.max_pending, capacity=args.capacity,
                          consumer_us=args.consumer_us)
            print(f"| {r.ranks} | {r.level} | {r.per_rank_step:.0f} | {r.emitted} | "
                  f"{r.delivered} | {r.rate:,.0f} | {r.dropped} | {r.gaps} | {r.lost_frames} | "
                  f"{r.p50_ms:.1f} | {r.p95_ms:.1f} | {r.clock_error_us:.0f} | {r.rejected} "
                  f"({r.shut}) | {r.emit_max_ms:.1f} |", flush=True)


if __name__ == "__main__":
    main()
