"""The kernel's share of issue #40's first paint, stage by stage: from a `.ddpviz` file to the
bytes the dashboard sends (`Trace.load`, then `Dashboard(trace)`: the run's columns joined,
its bytes for the browser, summarized per bucket over 64 MiB, and diagnose()'s findings).
bench_first_paint.py times the same two calls and the browser after them; this one splits
the kernel's part:

- Trace.load: reading and checking the frames into per-rank blocks of columns;
- Dashboard(trace), whole; and, on another load, its stages one by one:
  - the columns joined (`Trace.columns()`: each rank's blocks concatenated and widened to
    int64, the first time anything reads them);
  - the view's bytes (`view_bytes`: the hooks summarized per bucket, written as a file);
  - diagnose() (the findings), and those as the bytes sent.

Prints best-of-N wall and CPU seconds per stage (a table); nothing is asserted.

    PYTHONPATH=. python benchmarks/bench_kernel_paint.py /work/scale/cols-64x1000x20.ddpviz \
        [/work/scale/cols-256x10000x5.ddpviz ...] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddpviz._diagnose.diagnosis import diagnose
from ddpviz.traces.source import open_run
from ddpviz.traces.trace import Trace
from ddpviz.traces.view_bytes import diagnosis_bytes, view_bytes
from ddpviz.widgets.dashboard import Dashboard
from ddpviz.widgets.trace_view import MAX_BYTES


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall s, CPU s of this process, what `fn` returned)."""
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - start, time.process_time() - cpu, out


def stages(path: Path) -> dict[str, tuple[float, float]]:
    """One measurement of every stage (wall, CPU)."""
    out: dict[str, tuple[float, float]] = {}
    wall, cpu, trace = timed(lambda: Trace.load(path))
    out["Trace.load"] = (wall, cpu)
    wall, cpu, board = timed(lambda: Dashboard(trace))
    out["Dashboard(trace)"] = (wall, cpu)
    advisor = board._advisor  # (its thread, started last: after the stages, not in them)
    board.close()
    if advisor is not None:
        advisor.join()
    del trace, board
    gc.collect()
    trace = Trace.load(path)
    run = open_run(trace, refusal="the benchmark cannot read")
    out["  the columns joined"] = timed(trace.columns)[:2]
    out["  the view's bytes"] = timed(lambda: view_bytes(trace, run, limit=MAX_BYTES))[:2]
    wall, cpu, found = timed(lambda: list(diagnose(run)))
    out["  diagnose()"] = (wall, cpu)
    out["  the findings' bytes"] = timed(lambda: diagnosis_bytes(found))[:2]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    Dashboard(Trace()).close()  # (the widgets' first import, outside the stages)
    for path in args.paths:
        runs = [stages(path) for _ in range(args.repeat)]
        events = len(Trace.load(path))
        print(f"\n{path.name}: {events:,} events, best of {args.repeat}\n")
        print("| stage | wall s | CPU s |\n|---|---|---|")
        for name in runs[0]:
            wall = min(r[name][0] for r in runs)
            cpu = min(r[name][1] for r in runs)
            print(f"| {name} | {wall:.2f} | {cpu:.2f} |")
        total = min(r["Trace.load"][0] + r["Dashboard(trace)"][0] for r in runs)
        print(f"| Trace.load + Dashboard(trace) | {total:.2f} | |")


if __name__ == "__main__":
    main()
