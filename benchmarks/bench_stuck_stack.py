"""What a rank's stack without its GIL costs (probes/stuck_stack.py, thread_state.py):

- once per process, on the training thread: `arm()` (a free real-time signal, the private
  directory, faulthandler.register), in a fresh interpreter;
- on the pulse thread, at each wake (every 0.05-0.5 s): `Beacon.stamp`; every 0.5 s:
  `Beacon.check`;
- on a waiting rank, per rank that did not answer: `rescue_contacts` of a process whose main
  thread holds the GIL in C code (tests/probes/gil_holder.py), and its parts: the /proc reads
  (`thread_state`, `signal_masks`) and the signal until faulthandler's dump is complete.

Printed: median and p95 in microseconds (rescue in milliseconds).

    PYTHONPATH=. python benchmarks/bench_stuck_stack.py [--repeat 20000] [--rescues 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's ddpviz

import msgspec  # noqa: E402
from _timing import times_us  # noqa: E402

from ddpviz.probes import stuck_stack as ss  # noqa: E402
from ddpviz.probes import thread_state as ts  # noqa: E402


class _Posts:
    def post(self, name: str, data: str) -> None:
        pass


def _arm_once() -> float:
    code = ("import time; from ddpviz.probes import stuck_stack as ss; t = time.perf_counter();"
            " ss.arm(); print((time.perf_counter() - t) * 1e6)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return float(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=20000)
    parser.add_argument("--rescues", type=int, default=10)
    args = parser.parse_args()
    arms = sorted(_arm_once() for _ in range(5))
    beacon = ss.Beacon(threading.get_ident())
    starter = threading.Thread(target=beacon.started, args=(_Posts(),), daemon=True)
    starter.start()  # (on another thread, as the pulse thread does)
    starter.join()
    stamp = times_us(beacon.stamp, args.repeat)
    check = times_us(lambda: beacon.check(_Posts()), args.repeat)  # type: ignore[arg-type]
    pid, tid = os.getpid(), threading.get_native_id()
    state = times_us(lambda: ts.thread_state(pid, tid), 2000)
    masks = times_us(lambda: ts.signal_masks(pid), 2000)
    rescues: list[float] = []
    holds = 0
    for _ in range(args.rescues):
        child = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "probes" / "gil_holder.py"), "hold", "6"],
            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert child.stdout is not None
        contact = msgspec.json.decode(child.stdout.readline()[len("contact "):],
                                      type=ss.Contact)
        while (ss._stamp_age(contact.stamp) or 0) < ss.STALE_S:
            time.sleep(0.05)
        t = time.perf_counter()
        got = ss.rescue_contacts({1: contact})[1]
        rescues.append((time.perf_counter() - t) * 1e3)
        assert got.stack, got
        holds += got.holds_gil()
        child.kill()
        child.wait()
    rescues.sort()
    print("| what | where | median | p95 |")
    print("|---|---|---|---|")
    print(f"| arm() (once per process) | training thread | {statistics.median(arms):.0f} us | "
          f"{arms[-1]:.0f} us (max of 5) |")
    print(f"| Beacon.stamp (each wake) | pulse thread | {stamp[0]:.2f} us | {stamp[1]:.2f} us |")
    print(f"| Beacon.check (every 0.5 s) | pulse thread | {check[0]:.2f} us | "
          f"{check[1]:.2f} us |")
    print(f"| thread_state (stat, wchan, syscall) | waiting rank | {state[0]:.0f} us | "
          f"{state[1]:.0f} us |")
    print(f"| signal_masks (/proc/PID/status) | waiting rank | {masks[0]:.0f} us | "
          f"{masks[1]:.0f} us |")
    print(f"| rescue of one rank (signal, dump, read, /proc) | waiting rank | "
          f"{statistics.median(rescues):.0f} ms | {rescues[int(0.95 * len(rescues))]:.0f} ms |")
    print(f"\n'held the GIL' said for {holds} of {len(rescues)} rescues")


if __name__ == "__main__":
    main()
