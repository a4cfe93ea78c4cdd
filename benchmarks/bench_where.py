"""What knowing where a rank is in code costs (probes/where.py, whereabouts.py), in one process:

- on the training thread, at steps 0-2 and every 64th step: `Tracker.note_caller` checking that
  the DDP is still called from the same loop (a frame walk), per call and per step amortized;
- on the pulse thread, every 0.5 s while the training thread is quiet: `left_loop` on the
  training thread's stack;
- on the pulse thread, per stack request: `Tracker.take` (read, fold and format the stack).

The training thread is simulated at call depths of 12 and 40 frames (a plain script; a framework
such as Lightning). Printed: median and p95 per call, in microseconds.

    PYTHONPATH=. python benchmarks/bench_where.py [--repeat 2000]
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's ddpviz

from _timing import times_us

from ddpviz.probes import where as wh
from ddpviz.probes.whereabouts import Tracker


def _at_depth(depth: int, then: Callable[[], None]) -> None:
    if depth:
        _at_depth(depth - 1, then)
    else:
        then()


def training_loop(depth: int, measure: Callable[[Tracker], None]) -> None:
    for step in range(2):  # the loop that calls the DDP
        _at_depth(depth, lambda step=step: _forward(step, measure))


def _forward(step: int, measure: Callable[[Tracker], None]) -> None:
    tracker = Tracker(threading.get_ident())
    tracker.note_caller(sys._getframe(1))
    assert tracker.loop is not None, "the loop must be found"
    if step == 1:
        measure(tracker)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    rows = []
    for depth in (10, 38):
        def measure(tracker: Tracker, depth: int = depth) -> None:
            frame = sys._getframe(1)
            loop = tracker.loop
            assert loop is not None
            ident = threading.get_ident()
            note = times_us(lambda: tracker.note_caller(frame), args.repeat)
            left = times_us(lambda: wh.left_loop(loop, wh.thread_frame(ident)), args.repeat)
            take = times_us(lambda: tracker.take(1), max(50, args.repeat // 20))
            rows.append((depth + 2, note, left, take))

        training_loop(depth, measure)
    print("| frames | note_caller med/p95 us | per step (every 64th) us | left_loop med/p95 us "
          "| take med/p95 us |")
    print("|---|---|---|---|---|")
    for frames, note, left, take in rows:
        print(f"| {frames} | {note[0]:.1f} / {note[1]:.1f} | {note[0] / 64:.2f} | "
              f"{left[0]:.1f} / {left[1]:.1f} | {take[0]:.0f} / {take[1]:.0f} |")


if __name__ == "__main__":
    main()
