"""Cost of ddpviz's live event stream, rank -> kernel, on loopback (CPU only).

1. emit cost: ns per `Tap.emit` into a Sender, against the same Tap into a no-op emitter and
   into list.append (the collector runs in another process, as the notebook kernel would).
2. throughput: events/s from 1 and from 4 producer processes into one Collector.
3. latency: emit -> subscriber callback at a steady 2,000 events/s (both ends read the same
   monotonic clock, so the difference is exact), p50/p95/p99.
4. traces: save and load of a 1M-event `.ddpviz` file (4 ranks x 250k).

    python benchmarks/bench_transport.py [--events 1000000]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddpviz import events as ev
from ddpviz.traces.trace import Trace
from ddpviz.transport import Collector, Sender


def _emit_loop(tap: ev.Tap, n: int) -> float:
    """Seconds for n emits (GradReady: the most frequent event)."""
    start = time.perf_counter()
    for i in range(n):
        tap.emit(ev.GradReady, i & 1023, 0)
    return time.perf_counter() - start


def _emit_cost(connect: str, n: int, out: Any) -> None:
    """In a producer process: ns/emit for each emitter, alternating, best of 5 rounds."""
    results: dict[str, list[float]] = {"no-op": [], "list.append": [], "Sender": []}
    sender = Sender(connect, 0, capacity=6 * n + 16, batch=2048)
    for _ in range(5):
        results["no-op"].append(_emit_loop(ev.Tap(lambda e: None, 0), n))
        sink: list[ev.Event] = []
        results["list.append"].append(_emit_loop(ev.Tap(sink.append, 0), n))
        results["Sender"].append(_emit_loop(ev.Tap(sender, 0), n))
        sender.flush(60)
    sender.close(60)
    out.put({k: min(v) / n * 1e9 for k, v in results.items()} | {"dropped": sender.stats.dropped})


def _produce(connect: str, rank: int, n: int, out: Any) -> None:
    sender = Sender(connect, rank, capacity=n + 16, batch=2048)
    tap = ev.Tap(sender, rank)
    out.put(("start", time.monotonic_ns()))
    _emit_loop(tap, n)
    sender.close(120)
    out.put(("done", sender.stats.dropped))


def _paced(connect: str, rate: float, seconds: float, out: Any) -> None:
    sender = Sender(connect, 0)
    tap = ev.Tap(sender, 0)
    period = 1.0 / rate
    start = time.perf_counter()
    n = 0
    while (now := time.perf_counter() - start) < seconds:
        if now >= n * period:
            tap.emit(ev.GradReady, n & 1023, 0)
            n += 1
        else:
            time.sleep(min(period, n * period - now))
    sender.close(30)
    out.put(n)


def _spawn(target: Any, *args: Any) -> tuple[Any, Any]:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q), daemon=True)
    p.start()
    return p, q


def bench_emit(n: int) -> dict[str, float]:
    with Collector() as c:
        p, q = _spawn(_emit_cost, c.connect_string, n)
        result: dict[str, float] = q.get(timeout=600)
        p.join(30)
    return result


def bench_throughput(producers: int, n: int) -> float:
    with Collector() as c:
        last = [0]
        c.subscribe(lambda b: last.__setitem__(0, time.monotonic_ns()), batch=True)
        procs = [_spawn(_produce, c.connect_string, r, n) for r in range(producers)]
        starts = [q.get(timeout=120)[1] for _, q in procs]
        dropped = [q.get(timeout=600)[1] for _, q in procs]
        assert c.wait(lambda s: len(s.closed) == producers, timeout=120)
        stats = c.stats
        for p, _ in procs:
            p.join(30)
    assert stats.total_received == producers * n and not any(dropped), (stats, dropped)
    assert not any(stats.gaps.values())
    return producers * n / ((last[0] - min(starts)) / 1e9)


def bench_latency(rate: float, seconds: float) -> list[float]:
    lat: list[int] = []
    with Collector() as c:
        c.subscribe(lambda e: lat.append(time.monotonic_ns() - e.t_ns))
        p, q = _spawn(_paced, c.connect_string, rate, seconds)
        sent = q.get(timeout=seconds + 120)
        assert c.wait(lambda s: 0 in s.closed, timeout=30)
        p.join(30)
    assert len(lat) == sent
    qs = statistics.quantiles(lat, n=100)
    return [qs[49] / 1e6, qs[94] / 1e6, qs[98] / 1e6]


def bench_trace(n: int) -> tuple[float, float, int]:
    per_rank = n // 4
    trace = Trace(ev.GradReady(r, i // 50, i, i, i % 50, i % 3)
                  for r in range(4) for i in range(per_rank))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "big.ddpviz"
        start = time.perf_counter()
        trace.save(path)
        save_s = time.perf_counter() - start
        size = path.stat().st_size
        start = time.perf_counter()
        loaded = Trace.load(path)
        load_s = time.perf_counter() - start
    assert len(loaded) == 4 * per_rank
    return save_s, load_s, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    args = parser.parse_args()
    n = args.events
    print(f"ddpviz transport benchmark ({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")
    emit = bench_emit(200_000)
    one = bench_throughput(1, n)
    four = bench_throughput(4, n // 4)
    p50, p95, p99 = bench_latency(2000, 5.0)
    save_s, load_s, size = bench_trace(n)
    rows = [
        ("Tap.emit -> no-op emitter", f"{emit['no-op']:.0f} ns/event", "", "1.00"),
        ("Tap.emit -> list.append", f"{emit['list.append']:.0f} ns/event", "",
         f"{emit['list.append'] / emit['no-op']:.2f}"),
        ("Tap.emit -> Sender", f"{emit['Sender']:.0f} ns/event", "< 1000 ns",
         f"{emit['Sender'] / emit['no-op']:.2f}"),
        ("Sender's own share", f"{emit['Sender'] - emit['no-op']:.0f} ns/event", "", ""),
        ("1 rank -> kernel", f"{one:,.0f} events/s", ">= 200,000", ""),
        ("4 ranks -> kernel", f"{four:,.0f} events/s", ">= 200,000", ""),
        ("emit -> callback p50", f"{p50:.2f} ms", "", ""),
        ("emit -> callback p95", f"{p95:.2f} ms", "< 100 ms", ""),
        ("emit -> callback p99", f"{p99:.2f} ms", "", ""),
        (f"save {n:,}-event trace", f"{save_s:.2f} s", "", ""),
        (f"load {n:,}-event trace", f"{load_s:.2f} s", "< 2 s", f"{size / n:.0f} B/event"),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    head = ("measure", "result", "goal", "ratio")
    widths = [max(w, len(h)) for w, h in zip(widths, head, strict=True)]
    line = "  ".join(h.ljust(w) for h, w in zip(head, widths, strict=True))
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    if emit["dropped"]:
        print(f"(emit-cost run dropped {emit['dropped']:.0f} events)")


if __name__ == "__main__":
    main()
