"""What following a live run costs the kernel: a notebook Dashboard of a Session that simulated
ranks stream into, as a share of one core, per thread of the view.

A Session (`ddpviz.listen`) receives a synthetic run (tests/widgets/streams.py) of RANKS ranks
from Senders on a thread of this process, one step of every rank at a time, paced so the run
lasts about SECONDS; a `Dashboard` follows it (widgets/trace_view.py: new events as frames at
most twice a second, diagnose() at its pace, the bucket advisor on a thread of its own at its
pace). Printed: the CPU seconds of the view's two threads (read from /proc per thread) over
the run's wall time, i.e. the share of a core each took while the run went on (the last
findings and advice, computed once it ended, are a one-off and not counted), and the sends
and diagnoses done. Issue #40's goal is < 5% of a core for a 64-rank job.

Measured (this 2-core machine, load ~1.5, 64 ranks x 100 params x 40 steps, 531,776 events
over ~37 s): with diagnose() at 10% of the time and the advisor at 10% (stop 58), 5.2% + 11.3%
= 16.5% of a core; with 5% and 2% (trace_feed.DIAGNOSE_SHARE, ADVISE_SHARE), 4.4% + 0.4% =
4.9%.

    PYTHONPATH=. python benchmarks/bench_live_view.py [--ranks 64] [--params 100]
        [--steps 40] [--seconds 30]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's ddpviz

import ddpviz
from ddpviz.transport import Sender
from ddpviz.widgets import Dashboard
from tests.widgets.streams import synthetic_run

TICK_S = os.sysconf("SC_CLK_TCK")


def thread_cpu_s(native_id: int | None) -> float:
    """User + system CPU seconds of one thread of this process (0 once it is gone)."""
    if native_id is None:
        return 0.0
    try:
        fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK_S  # utime, stime


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--params", type=int, default=100)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=30.0)
    args = parser.parse_args()
    events = synthetic_run(args.ranks, args.params, args.steps)
    by_step: dict[int, list[ddpviz.events.Event]] = {}
    for e in events:
        by_step.setdefault(e.step, []).append(e)
    steps = sorted(by_step)
    pause = args.seconds / len(steps)
    with ddpviz.listen(show=False) as session:
        board = Dashboard(session)
        threads = {t.name: t for t in threading.enumerate()
                   if t.name in ("ddpviz-trace-view", "ddpviz-trace-advice")}
        ids = {name: t.native_id for name, t in threads.items()}
        cpu: dict[str, float] = dict.fromkeys(ids, 0.0)
        senders = {r: Sender(session.connect_string, r, batch=256) for r in range(args.ranks)}
        started = time.monotonic()
        for step in steps:
            for e in by_step[step]:
                senders[e.rank](e)
            for s in senders.values():
                s.flush()
            for name, tid in ids.items():  # (read while alive: a thread ends with the run)
                cpu[name] = max(cpu[name], thread_cpu_s(tid))
            time.sleep(pause)
        for s in senders.values():
            s.close()
        session.wait(ranks=args.ranks, timeout=60)
        wall = time.monotonic() - started
        for name, tid in ids.items():
            cpu[name] = max(cpu[name], thread_cpu_s(tid))
    print(f"{args.ranks} ranks x {args.params} params x {args.steps} steps: {len(events):,} "
          f"events over {wall:.1f} s; load average {os.getloadavg()[0]:.1f}")
    print("| thread | CPU s | share of a core |")
    print("|---|---|---|")
    for name in sorted(cpu):
        print(f"| {name} | {cpu[name]:.2f} | {100 * cpu[name] / wall:.1f}% |")
    total = sum(cpu.values())
    print(f"| both | {total:.2f} | {100 * total / wall:.1f}% |")
    print(f"{board.sends} sends of new events, {len(board.pace.took)} diagnoses, the advice "
          f"sent {board.advised} times; {board.events_sent:,} events sent")
    board.close()


if __name__ == "__main__":
    main()
