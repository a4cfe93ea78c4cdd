"""What a DDP heartbeat costs the training thread: posted inline (the store write per forward and
the alert round trip every 0.5 s that the watchdog did on the training thread until the pulse
thread took them over) vs handed to ddpviz's pulse thread (probes/pulse.py).

Two rank processes share a TCPStore hosted by rank 0 (as torchrun's and gloo's are); each calls
a heartbeat between simulated steps of `--work-us` of CPU work, alternating blocks of the two
variants, with `--hogs` busy processes competing for the CPUs (the store host starved of CPU is
what made inline heartbeats expensive). Printed: per-call time on the training thread (median,
p95, p99) and the share of a step it takes, per variant and number of hogs.

    PYTHONPATH=. python benchmarks/bench_heartbeat.py [--calls 3000] [--hogs 0,2]
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's ddpviz

ALERT_CHECK_S = 0.5  # the inline variant's alert check period (the watchdog's, before pulse)


def _busy_work(us: float) -> None:
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


def _rank(rank: int, port: int, args: Any, out: Any) -> None:
    import torch.distributed as dist

    from ddpviz.probes.pulse import Pulse
    from ddpviz.probes.rendezvous import Board, Scope

    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0,
                          timeout=datetime.timedelta(seconds=120))

    class Group:  # what Scope reads of a process group
        def rank(self) -> int:
            return rank

        def size(self) -> int:
            return 2

    board = Board(Scope(Group(), store=store), 0)  # type: ignore[arg-type]
    pulse = Pulse(Board(Scope(Group(), store=store.clone()), 0))  # type: ignore[arg-type]
    checked = -ALERT_CHECK_S

    def inline(step: int) -> None:
        nonlocal checked
        board.post_position({"state": "running", "step": step, "phase": "forward",
                             "t": time.time()})
        now = time.monotonic()
        if now - checked >= ALERT_CHECK_S:
            checked = now
            board.has_alerts()

    variants = {"inline store write": inline,
                "pulse thread": lambda step: pulse.beat(step, "forward")}
    samples: dict[str, list[int]] = {name: [] for name in variants}
    block = 100
    for rep in range(args.calls // block):
        for name, beat in (variants.items() if rep % 2 else reversed(variants.items())):
            for i in range(block):
                _busy_work(args.work_us)
                t0 = time.perf_counter_ns()
                beat(rep * block + i)
                samples[name].append(time.perf_counter_ns() - t0)
    pulse.close()
    store.set(f"done/{rank}", "1")
    store.wait([f"done/{1 - rank}"])
    out.put((rank, samples))
    if rank == 0:
        time.sleep(0.5)  # the host leaves last


def _hog() -> None:
    while True:
        pass


def _measure(hogs: int, args: Any) -> dict[str, list[int]]:
    ctx = mp.get_context("spawn")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    hog_procs = [ctx.Process(target=_hog, daemon=True) for _ in range(hogs)]
    for p in hog_procs:
        p.start()
    out: Any = ctx.Queue()
    ranks = [ctx.Process(target=_rank, args=(r, port, args, out)) for r in range(2)]
    try:
        for p in ranks:
            p.start()
        results = dict(out.get(timeout=600) for _ in ranks)
    finally:
        for p in ranks:
            p.join(30)
            if p.is_alive():
                p.kill()
        for p in hog_procs:
            p.kill()
    return results[0]


def _pct(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--work-us", type=float, default=1000.0,
                        help="simulated step between heartbeats (default 1000 us)")
    parser.add_argument("--hogs", default="0,2", help="busy processes, comma-separated counts")
    args = parser.parse_args()
    print(f"heartbeat cost on the training thread, rank 0 of 2 (store host), {args.calls} "
          f"calls per variant, steps of {args.work_us:g} us, {os.cpu_count()} CPUs")
    print(f"{'hogs':>4}  {'variant':<20} {'median us':>9} {'p95 us':>8} {'p99 us':>8} "
          f"{'mean us':>8} {'of a step':>9}")
    for hogs in (int(h) for h in args.hogs.split(",")):
        samples = _measure(hogs, args)
        for name, values in samples.items():
            mean = statistics.fmean(values) / 1000
            print(f"{hogs:>4}  {name:<20} {statistics.median(values) / 1000:>9.1f} "
                  f"{_pct(values, 0.95):>8.1f} {_pct(values, 0.99):>8.1f} {mean:>8.1f} "
                  f"{mean / args.work_us:>9.2%}")


if __name__ == "__main__":
    main()
