"""Attaching a notebook to a running `ddpviz record --out DIR` job (`ddpviz.listen(follow=DIR)`).

1. First paint of a 64-rank job's history: a synthetic recorded folder (one
   `ddpviz-trace-rank{R}.ddpviz` per rank, bench_scale.py's events: every gradient hook on every
   step, the worst case; a job at the default recording writes ~10x fewer events per step), then
   `listen(follow=DIR)` + `session.dashboard()` (built and drawn once), beside the offline path
   (`Trace.load` of every file, `Trace.merge`, `trace.dashboard()`). Wall and CPU seconds,
   events per second, and the ratio attach / offline.
2. What an attached notebook costs the job: a real 2-rank gloo job under `ddpviz record --out`
   (benchmarks/_attach_job.py), held after WARMUP steps until this process has attached (or
   not), then timing its own steps (wall and training-thread CPU, median over the steps on
   rank 0). Runs alternate attached / not attached, the order flipping every repetition; the
   attached runs keep a live dashboard fed by the poll thread. Printed: medians and ratios.
3. `--busy 32,64,128` (issue #37 M4): the attach to a busy job, a writer process appending a
   frame of 100 events per rank every 20 ms (staggered over the ranks) for 2 s before and all
   through the attach; seconds until `FolderFeed.start` returned, or that it did not in 30 s.
4. `--files 400x40,1600x40` (issue #37 M5): the history of many small files (files x frames
   of 3 events, a clock record each): CPU seconds of `FolderFeed.start`, and per frame.

    PYTHONPATH=. python benchmarks/bench_attach.py [--sizes 64x1000x5,64x1000x20]
        [--reps 3] [--steps 400] [--skip-job] [--skip-paint] [--busy 32,64,128]
        [--files 400x40,1600x40]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._ranks import free_port  # noqa: E402
from benchmarks.bench_scale import generate  # noqa: E402
from ddpviz.session.follow import FolderFeed, follow_folder  # noqa: E402
from ddpviz.session.live import Session  # noqa: E402
from ddpviz.traces.fileformat import TraceWriter  # noqa: E402
from ddpviz.traces.trace import Trace  # noqa: E402
from tests.record.hooked import hooked_python  # noqa: E402

JOB = ROOT / "benchmarks" / "_attach_job.py"


def recorded_folder(folder: Path, ranks: int, params: int, steps: int) -> int:
    """A folder as `ddpviz record --out` leaves it: one file per rank, per-rank metadata."""
    whole = folder / "whole.ddpviz"
    n = generate(whole, ranks, params, steps)
    trace = Trace.load(whole)
    whole.unlink()
    for r in trace.ranks:
        meta = {"rank": r, "host": "node0", "pid": 1000 + r, "boot": "b",
                "mono_ns": 10**12, "wall_ns": 1_700_000_000 * 10**9}
        with TraceWriter(folder / f"ddpviz-trace-rank{r}.ddpviz", meta=meta, chunk=4096) as w:
            w.write_many(trace.events(r))
    return n


def clocked(fn):  # type: ignore[no-untyped-def]
    gc.collect()
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def first_paint(size: str) -> None:
    ranks, params, steps = (int(x) for x in size.lower().split("x"))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        n = recorded_folder(folder, ranks, params, steps)
        mib = sum(p.stat().st_size for p in folder.iterdir()) / 2**20
        rows = []
        for rep in range(3):
            def live():  # type: ignore[no-untyped-def]
                session = follow_folder(folder, show=False)
                board = session.dashboard()
                return session, board

            def offline():  # type: ignore[no-untyped-def]
                files = sorted(folder.glob("*.ddpviz"))
                return Trace.merge(Trace.load(f) for f in files).dashboard()

            for name, fn in (("listen(follow=DIR) + dashboard", live),
                             ("Trace.load x N + merge + dashboard", offline))[::1 - 2 * (rep % 2)]:
                wall, cpu, made = clocked(fn)
                if name.startswith("listen"):
                    session, board = made
                    assert len(session.trace) == n and len(board.model) == n
                    board.close()
                    session.close()
                else:
                    made.close()
                rows.append((name, wall, cpu))
                del made
        print(f"\n## first paint: {ranks} ranks x {params:,} params x {steps} steps, every hook: "
              f"{n:,} events in {ranks} files, {mib:,.0f} MiB (load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; median of 3)\n")
        print(f"{'path':<38}{'wall s':>8}{'CPU s':>8}{'events/s':>12}")
        med = []
        for name in dict.fromkeys(r[0] for r in rows):
            wall = statistics.median(r[1] for r in rows if r[0] == name)
            cpu = statistics.median(r[2] for r in rows if r[0] == name)
            med.append((wall, cpu))
            print(f"{name:<38}{wall:>8.2f}{cpu:>8.2f}{n / wall / 1e6:>11.2f}M")
        (live_w, live_c), (off_w, off_c) = med
        print(f"{'ratio attach / offline':<38}{live_w / off_w:>8.2f}{live_c / off_c:>8.2f}")


def latency(events: int = 40, every_s: float = 0.05) -> None:
    """From a frame handed to the OS to the attached session's subscriber (the poll)."""
    from ddpviz import events as ev
    from ddpviz.session.follow import POLL_S

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        delays: list[float] = []
        with TraceWriter(folder / "ddpviz-trace-rank0.ddpviz", meta={"rank": 0}) as w:
            w.flush()
            session = follow_folder(folder, show=False)
            session.subscribe(lambda e: delays.append((time.monotonic_ns() - e.t_ns) / 1e6))
            for i in range(events):
                w(ev.ForwardStarted(0, i, time.monotonic_ns(), i))
                w.flush()
                time.sleep(every_s)
            session.wait(events=events, timeout=60)
            session.close()
    delays.sort()
    print(f"\n## new events: frame written -> subscriber, poll every {POLL_S} s, {len(delays)} "
          f"events {every_s * 1e3:.0f} ms apart\n")
    print(f"median {statistics.median(delays):.0f} ms, p95 "
          f"{delays[int(0.95 * (len(delays) - 1))]:.0f} ms, max {delays[-1]:.0f} ms "
          "(plus the ranks' own ~20 ms from event to file)")


# --- the job's step time, attached or not -----------------------------------------------------

def run_job(python: str, folder: Path, steps: int, attached: bool) -> dict[str, float]:
    gate = folder / "gate"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DDPVIZ_", "RANK", "WORLD_SIZE", "MASTER_"))}
    env.update(OMP_NUM_THREADS="1", JOB_STEPS=str(steps), JOB_GATE=str(gate),
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]))
    out = folder / "traces"
    job = subprocess.Popen(
        [python, "-m", "ddpviz", "record", "--out", str(out), "--", python, "-m",
         "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
         str(JOB)], env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    session = board = None
    try:
        while not all(Path(f"{gate}.reached{r}").exists() for r in (0, 1)):
            if job.poll() is not None:
                raise SystemExit(f"the job ended early:\n{job.communicate()}")
            time.sleep(0.05)
        if attached:
            session = follow_folder(out, show=False)
            board = session.dashboard()
        wall, cpu = time.perf_counter(), time.process_time()
        gate.touch()
        stdout, stderr = job.communicate(timeout=600)
        # the notebook's side: this process's CPU (poll thread, dashboard redraws) per second
        notebook = (time.process_time() - cpu) / (time.perf_counter() - wall)
    finally:
        if job.poll() is None:
            job.kill()
    if board is not None and session is not None:
        board.close()
        session.close()
    if job.returncode != 0:
        raise SystemExit(f"the job failed:\n{stdout}\n{stderr}")
    found = re.search(r"ATTACH_BENCH (\{.*?\})", stdout)
    assert found, stdout
    result: dict[str, float] = json.loads(found.group(1))
    result["notebook_cpu"] = notebook
    return result


def job_cost(reps: int, steps: int) -> None:
    python = hooked_python(Path(tempfile.mkdtemp()))
    runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
    for rep in range(reps):
        for attached in (False, True) if rep % 2 == 0 else (True, False):
            with tempfile.TemporaryDirectory() as tmp:
                r = run_job(python, Path(tmp), steps, attached)
            runs[attached].append(r)
            print(f"  repetition {rep + 1}/{reps}, {'attached' if attached else 'not attached'}:"
                  f" {r['wall_ms']:.3f} ms wall, {r['cpu_ms']:.3f} ms CPU per step",
                  file=sys.stderr)
    print(f"\n## the job's step time, 2 gloo ranks under `ddpviz record --out`, rank 0, median "
          f"over {steps} steps after warm-up, median of {reps} runs each (load average "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)\n")
    print(f"{'':<24}{'not attached':>14}{'attached':>12}{'ratio':>8}  range")
    for key, label in (("wall_ms", "wall per step"), ("cpu_ms", "training-thread CPU")):
        plain = [r[key] for r in runs[False]]
        att = [r[key] for r in runs[True]]
        ratios = [a / p for a, p in zip(att, plain, strict=True)]
        print(f"{label:<24}{statistics.median(plain):>11.3f} ms{statistics.median(att):>9.3f} ms"
              f"{statistics.median(ratios):>8.3f}  {min(ratios):.3f}-{max(ratios):.3f}")
    busy = statistics.median(r["notebook_cpu"] for r in runs[True])
    idle = statistics.median(r["notebook_cpu"] for r in runs[False])
    print(f"\nthe notebook's process while the job ran: {busy:.1%} of a CPU attached (poll "
          f"thread, live dashboard), {idle:.1%} not attached. On this 2-CPU machine it shares "
          "the ranks' CPUs; on a cluster it runs elsewhere.")


# --- a busy job, many files (issue #37) --------------------------------------------------------

BUSY_WRITER = r"""
import sys, time
from ddpviz import events as ev
from ddpviz.traces.fileformat import TraceWriter
folder, n, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
writers = [TraceWriter(f"{folder}/ddpviz-trace-rank{r}.ddpviz", meta={"rank": r})
           for r in range(n)]
print("ready", flush=True)
step, t = 0, time.monotonic()
while True:
    for r, w in enumerate(writers):  # rank r's frame at r/n of each 20 ms period
        first = per * step
        w.write_many([ev.ForwardStarted(r, step, k, k) for k in range(first, first + per)])
        w.flush()
        t += 0.02 / n
        time.sleep(max(0.0, t - time.monotonic()))
    step += 1
"""


def busy_attach(ranks_list: list[int], per: int = 100, cap: float = 30.0) -> None:
    print(f"\n## the attach to a busy job: a frame of {per} events per rank every 20 ms, 2 s of "
          f"history (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)\n")
    print(f"{'ranks':>6}  start() returned after")
    for ranks in ranks_list:
        with tempfile.TemporaryDirectory() as tmp:
            job = subprocess.Popen([sys.executable, "-c", BUSY_WRITER, tmp, str(ranks), str(per)],
                                   stdout=subprocess.PIPE, text=True,
                                   env={**os.environ, "PYTHONPATH": str(ROOT)})
            try:
                assert job.stdout is not None and job.stdout.readline().strip() == "ready"
                time.sleep(2.0)
                feed = FolderFeed(tmp, interval=0.25)
                session = Session(feed)
                began = time.perf_counter()
                attach = threading.Thread(target=feed.start, daemon=True)
                attach.start()
                attach.join(cap)
                done = not attach.is_alive()
                took = time.perf_counter() - began
                feed._stop.set()  # ends an attach still reading
                attach.join(60)
                session.close()
            finally:
                job.kill()
                job.wait()
        print(f"{ranks:>6}  " + (f"{took:.2f} s" if done else f"not in {cap:.0f} s"))


def many_files(sizes: list[str]) -> None:
    from ddpviz import events as ev

    print(f"\n## the history of many small files (load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} CPUs)\n")
    print(f"{'files x frames':>16}{'events':>10}{'CPU s':>8}{'µs/frame':>10}")
    for size in sizes:
        files, frames = (int(x) for x in size.lower().split("x"))
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(files):
                with TraceWriter(Path(tmp) / f"ddpviz-trace-rank{r}.ddpviz",
                                 meta={"rank": r}) as w:
                    w.write_clock(r, 0, 1)
                    for i in range(frames):
                        w.write_many([ev.ForwardStarted(r, i, 3 * i + k, 3 * i + k)
                                      for k in range(3)])
                        w.flush()
            feed = FolderFeed(tmp, interval=3600)
            session = Session(feed)
            _, cpu, _ = clocked(feed.start)
            n = len(session.trace)
            session.close()
        print(f"{size:>16}{n:>10,}{cpu:>8.2f}{cpu / (files * frames) * 1e6:>10.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="64x1000x5,64x1000x20")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--skip-job", action="store_true")
    parser.add_argument("--skip-paint", action="store_true")
    parser.add_argument("--busy", default="", help="ranks, comma-separated (issue #37 M4)")
    parser.add_argument("--files", default="", help="FILESxFRAMES, comma-separated (#37 M5)")
    args = parser.parse_args()
    if args.busy:
        busy_attach([int(r) for r in args.busy.split(",")])
    if args.files:
        many_files(args.files.split(","))
    if not args.skip_paint:
        for size in args.sizes.split(","):
            first_paint(size)
        latency()
    if not args.skip_job:
        job_cost(args.reps, args.steps)


if __name__ == "__main__":
    main()
