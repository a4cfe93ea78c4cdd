"""Analysis at memory speed: load, diagnose, event model, report and Chrome export on big traces.

Synthetic `.ddpviz` traces as a DDP job would record them with every gradient hook: per rank
the constructor's events (ParamsBuilt with every parameter, verification, the state broadcast,
the constructor's bucket map), then per step ForwardStarted, BackwardStarted, one GradReady per
parameter in reverse registration order (with a few neighbours swapped, as autograd does),
BucketReady / AllReduceLaunched per bucket as it fills, AllReduceDone per bucket,
BackwardFinished; step 1 also rebuilds the buckets (BucketsRebuilt, BucketAssigned). Times
advance by a jittered per-event cost per rank, and each rank's clock has its own offset.
About 100 parameters per bucket.

For each size: events/s of each stage (wall clock and this process's CPU time: on a shared
machine the CPU time is the steadier figure; the load average is printed; the trace is loaded
once for all stages), the bytes held per event (growth of resident anonymous memory: the
loaded Trace, then the EventModel on top of it) and the process's peak RSS. Sizes as
`RANKSxPARAMSxSTEPS`; the default runs the two sizes of issue #13.

The "dashboard first paint" stage builds `ddpviz.widgets.Dashboard(trace)`: what the kernel
does before the browser draws (issue #21's first paint): the run's `.ddpviz` bytes for the
TraceView and diagnose()'s findings (a run over the view's MAX_BYTES says so instead). The
widget modules are imported once before, on a tiny trace: that first import is printed on its
own line, not in the stage.
The last row sums `Trace.load`, `diagnose()` and the first paint: issue #21's "from file to
findings to first paint" (< 5 s for 256x10000x5).
`--file PATH` runs the stages on an existing trace instead of generating one; `--stages`
picks stages (`--stages dashboard` measures load + first paint alone, so the peak RSS printed
is theirs).
`--load FILE,...` times only `Trace.load` of existing traces, each load in a fresh child
process (CPU s, wall s and the child's peak RSS); with `--against ROOT` (another checkout, e.g.
main's worktree) its loader runs too, interleaved with this one's, for a before/after table.

    PYTHONPATH=. python benchmarks/bench_scale.py [--sizes 64x1000x20,256x10000x5] [--keep DIR]
    PYTHONPATH=. python benchmarks/bench_scale.py --file /work/scale/scale-64x1000x20.ddpviz \
        --stages dashboard
    PYTHONPATH=. python benchmarks/bench_scale.py --load A.ddpviz,B.ddpviz [--against ROOT]
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ddpviz import events as ev
from ddpviz._diagnose.diagnosis import diagnose
from ddpviz.report.chrome_trace import write_chrome_trace
from ddpviz.report.html import render
from ddpviz.traces.fileformat import TraceWriter
from ddpviz.traces.trace import Trace, gc_paused

PARAMS_PER_BUCKET = 100


def generate(path: Path, ranks: int, params: int, steps: int, seed: int = 0) -> int:
    """Write the synthetic trace to `path`; returns the number of events."""
    rng = random.Random(seed)
    names = [f"layers.{i // 2}.{'weight' if i % 2 == 0 else 'bias'}" for i in range(params)]
    shapes = [(1024, 256) if i % 2 == 0 else (1024,) for i in range(params)]
    infos = tuple(ev.ParamInfo(i, names[i], shapes[i], "float32", "cpu", False, 4)
                  for i in range(params))
    reverse = list(range(params - 1, -1, -1))
    buckets = tuple(tuple(reverse[i:i + PARAMS_PER_BUCKET])
                    for i in range(0, params, PARAMS_PER_BUCKET))
    limits = (25 << 20,) * len(buckets)
    nbytes = [sum(4 * (1024 * 256 if p % 2 == 0 else 1024) for p in b) for b in buckets]
    total = sum(nbytes)
    bucket_of = [0] * params
    for b, members in enumerate(buckets):
        for p in members:
            bucket_of[p] = b
    count = 0
    with TraceWriter(path, meta={"synthetic": True, "ranks": ranks, "params": params,
                                 "steps": steps}, chunk=8192) as w, gc_paused():
        for r in range(ranks):
            w.write_clock(r, rng.randint(-50_000, 50_000), 2_000)
        for r in range(ranks):
            seq = 0
            t = 10**12 + rng.randint(0, 10**6)
            cost = 1500 + rng.randint(-200, 200)  # this rank's ns per gradient hook

            def put(cls: type[ev.Event], step: int, *fields: Any, dt: int = 1000,
                    rank: int = r) -> None:
                nonlocal seq, t, count
                t += dt
                w(cls(rank, step, t, seq, *fields))
                seq += 1
                count += 1

            put(ev.ParamsBuilt, -1, infos, ("bn.running_mean",), ())
            put(ev.VerificationStarted, -1, ranks, params, 1)
            put(ev.VerificationPassed, -1, ranks, "9f3a")
            put(ev.BroadcastStarted, -1, 0, params + 1, total, 1)
            put(ev.BroadcastChunkSent, -1, 0, "float32", "cpu", total, params + 1)
            put(ev.BroadcastChunkDone, -1, 0, total, dt=200_000)
            put(ev.BroadcastFinished, -1, total, 0.0002)
            put(ev.BucketAssigned, -1, buckets, limits, False)
            for step in range(steps):
                put(ev.ForwardStarted, step, dt=50_000)
                if step == 1:
                    put(ev.BucketsRebuilt, step, tuple(reverse))
                    put(ev.BucketAssigned, step, buckets, limits, True)
                put(ev.BackwardStarted, step, dt=2_000_000)
                # autograd's order is not quite reverse, the same on every rank; rank 1
                # swaps two more gradients at the last step (one grad_order finding)
                swaps = random.Random(step)
                order = list(reverse)
                for _ in range(params // 50 + (r == 1 and step == steps - 1)):
                    i = swaps.randrange(params - 1)
                    if bucket_of[order[i]] == bucket_of[order[i + 1]]:
                        order[i], order[i + 1] = order[i + 1], order[i]
                events: list[ev.Event] = []
                jitter = [rng.randint(-300, 300) for _ in range(64)]
                left = [len(b) for b in buckets]
                next_bucket = 0
                for i, p in enumerate(order):
                    t += cost + jitter[i & 63]
                    b = bucket_of[p]
                    events.append(ev.GradReady(r, step, t, seq, p, b))
                    seq += 1
                    left[b] -= 1
                    while next_bucket < len(buckets) and left[next_bucket] == 0:
                        t += 300
                        events.append(ev.BucketReady(r, step, t, seq, next_bucket))
                        t += 500
                        events.append(ev.AllReduceLaunched(r, step, t, seq + 1, next_bucket,
                                                           nbytes[next_bucket], "float32"))
                        seq += 2
                        next_bucket += 1
                w.write_many(events)
                count += len(events)
                for b in range(len(buckets)):
                    put(ev.AllReduceDone, step, b, dt=20_000 + rng.randint(0, 5_000))
                put(ev.BackwardFinished, step)
            w.flush()
    return count


def timed(fn: Callable[[], Any]) -> tuple[tuple[float, float], Any]:
    """((wall s, CPU s of this process), what `fn` returned)."""
    gc.collect()
    start, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return (time.perf_counter() - start, time.process_time() - cpu), result


def rss() -> int:
    """This process's resident anonymous memory in bytes, after handing freed heap back."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    fields = Path("/proc/self/status").read_text().split("\n")
    anon = next(line for line in fields if line.startswith("RssAnon:"))
    return int(anon.split()[1]) * 1024


def held(fn: Callable[[], Any]) -> tuple[int, Any]:
    """Growth of resident anonymous memory (not the page cache of a mapped file) from before
    `fn` to after it, with what it returned kept alive."""
    before = rss()
    result = fn()
    return rss() - before, result


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


STAGES = ("diagnose", "model", "dashboard", "report", "chrome")


def run_size(ranks: int, params: int, steps: int, folder: Path,
             chosen: tuple[str, ...] = STAGES) -> None:
    path = folder / f"scale-{ranks}x{params}x{steps}.ddpviz"
    (seconds, _), n = timed(lambda: generate(path, ranks, params, steps))
    run_file(path, chosen, folder, f"generated in {seconds:.1f} s", expected=n)
    path.unlink()


def run_file(path: Path, chosen: tuple[str, ...], folder: Path, how: str = "",
             expected: int | None = None) -> None:
    """The stages on the trace at `path`, then the memory it and its model hold."""
    if "dashboard" in chosen:
        warm_s = warm_widgets()
        print(f"\n(first import of the widgets: {warm_s[0]:.2f} s "
              f"wall, {warm_s[1]:.2f} s CPU; outside the stages)")
    load_s, trace = timed(lambda: Trace.load(path))
    n = len(trace)
    assert expected is None or n == expected
    meta = trace.meta if isinstance(getattr(trace, "meta", None), dict) else {}
    label = (f"{meta['ranks']} ranks x {meta['params']:,} params x {meta['steps']} steps"
             if {"ranks", "params", "steps"} <= meta.keys() else f"{len(trace.ranks)} ranks")
    print(f"\n## {label}: {n:,} events, file {path.stat().st_size / 2**20:,.0f} MiB "
          f"({how or path}); load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs\n")
    cpu, wall, peak, _ = load_in_child(ROOT, path)
    rows = [("Trace.load", load_s, ""),
            ("Trace.load (fresh process)", (wall, cpu), f"peak RSS {peak:,.0f} MiB"),
            *stages(trace, folder, chosen)]
    timed_stage = {name: times for name, times, _ in rows}
    path_stages = ("Trace.load", "diagnose()", "dashboard first paint")
    if all(name in timed_stage for name in path_stages):  # issue #21's number
        rows.append(("file -> findings -> first paint (the three above)",
                     (sum(timed_stage[name][0] for name in path_stages),
                      sum(timed_stage[name][1] for name in path_stages)),
                     f"peak RSS of this process {peak_rss_mb():,.0f} MiB"))
    print("| stage | wall s | events/s | CPU s | events/CPU-s | note |")
    print("|---|---|---|---|---|---|")
    for name, (wall, cpu), note in rows:
        print(f"| {name} | {wall:.2f} | {n / wall / 1e6:.2f}M | {cpu:.2f} | "
              f"{n / cpu / 1e6:.2f}M | {note} |")
    del trace
    if "model" not in chosen:
        print(f"\nload average now {os.getloadavg()[0]:.1f}; peak RSS of this process "
              f"{peak_rss_mb():,.0f} MiB")
        return
    trace_bytes, held_trace = held(lambda: Trace.load(path))
    model_bytes, model = held(held_trace.model)
    print(f"\nload average now {os.getloadavg()[0]:.1f}. "
          f"Held: Trace {trace_bytes / n:.0f} bytes/event, EventModel on top "
          f"{model_bytes / n:.0f} bytes/event; peak RSS of this process so far "
          f"{peak_rss_mb():,.0f} MiB")
    del held_trace, model
    gc.collect()


def warm_widgets() -> tuple[float, float]:
    """Import the dashboard's modules by opening one on a tiny trace, so that the stage times
    the first paint and not the first import."""
    def tiny() -> None:
        from ddpviz.widgets.dashboard import Dashboard

        events: list[ev.Event] = [ev.ForwardStarted(0, 0, 1, 0), ev.BackwardStarted(0, 0, 2, 1)]
        Dashboard(Trace(events)).close()
    return timed(tiny)[0]


def dashboard_of(trace: Trace) -> Any:
    from ddpviz.widgets.dashboard import Dashboard

    return Dashboard(trace)


Row = tuple[str, tuple[float, float], str]


def stages(trace: Trace, folder: Path, chosen: tuple[str, ...] = STAGES) -> list[Row]:
    rows: list[Row] = []
    if "diagnose" in chosen:
        diag_s, findings = timed(lambda: diagnose(trace))
        kinds = ", ".join(sorted({f.kind for f in findings}))
        rows.append(("diagnose()", diag_s, f"{len(findings)} findings ({kinds})"))
    if "model" in chosen:
        model_s, model = timed(trace.model)
        rows.append(("EventModel (dashboard's model)", model_s, f"{len(model.steps)} steps"))
        del model
    if "dashboard" in chosen:
        from ddpviz.traces.view_bytes import TraceViewError

        before = peak_rss_mb()
        refused: list[str] = []

        def paint() -> Any:
            try:
                return dashboard_of(trace)
            except TraceViewError as exc:  # over what a view sends to the browser
                refused.append(str(exc).split("\n")[0])
                return None

        paint_s, board = timed(paint)
        if board is None:  # (the time to find out, with why)
            rows.append(("dashboard first paint (refused)", paint_s, refused[0]))
        else:
            rows.append(("dashboard first paint", paint_s,
                         f"{len(board.trace) / 2**20:,.1f} MiB sent, peak RSS "
                         f"{before:,.0f} -> {peak_rss_mb():,.0f} MiB"))
            board.close()
            del board
    if "report" in chosen:
        report_s, html = timed(lambda: render(trace))
        rows.append(("report (HTML)", report_s, f"{len(html) / 2**20:.1f} MiB"))
        del html
    if "chrome" in chosen:
        chrome = folder / "chrome.json"
        chrome_s, _ = timed(lambda: write_chrome_trace(trace, chrome))
        rows.append(("Chrome export (file)", chrome_s,
                     f"{chrome.stat().st_size / 2**20:,.0f} MiB"))
        chrome.unlink()
    return rows


ROOT = Path(__file__).resolve().parents[1]
_LOAD_CHILD = """
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
from ddpviz.traces.trace import Trace
cpu, wall = time.process_time(), time.perf_counter()
trace = Trace.load(sys.argv[2])
cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
print(json.dumps([cpu, wall, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  len(trace)]))
"""


def load_in_child(root: Path, path: Path) -> tuple[float, float, float, int]:
    """(CPU s, wall s, peak RSS MiB, events) of `Trace.load(path)` with the ddpviz of `root`,
    in a fresh process (its peak RSS is the load's: the interpreter and imports, then the
    trace)."""
    proc = subprocess.run([sys.executable, "-c", _LOAD_CHILD, str(root), str(path)],
                          capture_output=True, text=True, check=True, cwd=root,
                          env=dict(os.environ, PYTHONPATH=str(root)))
    cpu, wall, peak, n = json.loads(proc.stdout.strip().splitlines()[-1])
    return cpu, wall, peak, n


def compare_loads(paths: list[Path], against: Path | None, repeat: int) -> None:
    """`Trace.load` of each trace by this checkout (and by `against`), interleaved runs."""
    roots = [("this", ROOT)] + ([("against", against)] if against else [])
    print(f"Trace.load, median of {repeat} interleaved runs, each in a fresh process; load "
          f"average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs\n")
    print("| trace | events | loader | CPU s | wall s | peak RSS MiB | events/CPU-s |")
    print("|---|---|---|---|---|---|---|")
    for path in paths:
        runs: dict[str, list[tuple[float, float, float, int]]] = {name: [] for name, _ in roots}
        for _ in range(repeat):
            for name, root in roots:
                runs[name].append(load_in_child(root, path))
        cpus = {}
        for name, _ in roots:
            cpu, wall, peak = (statistics.median(r[i] for r in runs[name]) for i in range(3))
            n = runs[name][0][3]
            cpus[name] = cpu
            print(f"| {path.name} | {n:,} | {name} | {cpu:.2f} | {wall:.2f} | {peak:,.0f} | "
                  f"{n / cpu / 1e6:.2f}M |")
        if against:
            print(f"| {path.name} | | against/this CPU | {cpus['against'] / cpus['this']:.1f}x "
                  "| | | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="64x1000x20,256x10000x5")
    parser.add_argument("--keep", type=Path, default=None, help="write the traces here")
    parser.add_argument("--load", default=None, help="time only Trace.load of these traces")
    parser.add_argument("--against", type=Path, default=None,
                        help="with --load: also another checkout's loader (e.g. main's)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--file", type=Path, action="append", default=[],
                        help="run the stages on this existing trace (repeatable; no --sizes "
                             "then)")
    parser.add_argument("--stages", default=",".join(STAGES),
                        help=f"comma-separated, of {','.join(STAGES)} (Trace.load always runs)")
    args = parser.parse_args()
    if args.load:
        compare_loads([Path(p) for p in args.load.split(",")], args.against, args.repeat)
        return
    chosen = tuple(x.strip() for x in args.stages.split(",") if x.strip())
    unknown = sorted(set(chosen) - set(STAGES))
    if unknown:
        parser.error(f"unknown stage(s) {', '.join(unknown)}; pick from {', '.join(STAGES)}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if args.file:
            for path in args.file:
                run_file(path, chosen, folder)
            return
        for size in args.sizes.split(","):
            ranks, params, steps = (int(x) for x in size.lower().split("x"))
            run_size(ranks, params, steps, folder, chosen)


if __name__ == "__main__":
    main()
