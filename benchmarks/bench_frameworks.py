"""What `ddpviz record` costs per training step inside a framework's job: HF Trainer (GPT-2
from a tiny config, torchrun) and Lightning (strategy="ddp"), 2 gloo ranks on CPU, the jobs of
tests/frameworks/jobs.

Each repetition launches the same job unrecorded and recorded (`ddpviz record --out DIR`),
alternating (the order flips every repetition, so noise from other processes hits both alike).
The job times each step itself (a Trainer callback, a Lightning callback: on_step_begin/end,
on_train_batch_start/end) and writes the times per rank; a run's step time is the median over
its steps after WARMUP, on rank 0. Printed: per framework, the median unrecorded and recorded
step time over repetitions and their ratio, with the range of the per-repetition ratios.
Launch and import time are not counted (the job's own steps only).

    PYTHONPATH=. python benchmarks/bench_frameworks.py [--reps 3] [--steps 40]

With --in-process the A/B happens inside one job instead: the job's step clock watches its DDP
with `ddpviz.watch()` (the default recording, as `ddpviz record` does) in every other block of
--block steps and closes the watch in between (tests/frameworks/jobs/report.py, FW_TOGGLE), so
launches, imports and the machine's load drift weigh on both sides alike. The first SETTLE
steps of every block are left out of the steady-state ratio: a fresh watch records
per-parameter hooks on its steps 0-2 (Recording(every=100)), whose cost is printed on its own.

    PYTHONPATH=. python benchmarks/bench_frameworks.py --in-process [--blocks 8] [--block 12]

`--only lightning` runs the frameworks whose name holds that text.

Needs the frameworks extra (`pip install -e '.[frameworks]'`) and ddpviz's startup hook in this
Python (an installed ddpviz; tests/record/hooked.py makes an overlay otherwise).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.frameworks.harness import job_env, plain_python, torchrun  # noqa: E402
from tests.record.hooked import hooked_python  # noqa: E402

WARMUP = 5  # steps left out: the first steps build buckets, rebuild them, warm caches
SETTLE = 3  # steps left out at the start of every block (a fresh watch samples steps 0-2)
FRAMEWORKS = {
    "HF Trainer (torchrun)": ("hf_trainer.py", torchrun, {}),
    "Lightning ddp": ("lightning_job.py", plain_python, {"FW_STRATEGY": "ddp"}),
}


def run_job(python: str, script: str, command: object, extra: dict[str, str], steps: int,
            tmp: Path, *, recorded: bool = False, timeout: float = 600,
            **env: str) -> dict[str, Any]:
    """Run the job once (under `ddpviz record` if `recorded`); rank 0's report."""
    from tests.dist.harness import free_port

    out = Path(tempfile.mkdtemp(dir=tmp))
    job = job_env(out, FW_OUT=str(out / "reports"), FW_STEPS=str(steps),
                  MASTER_PORT=str(free_port()), **extra, **env)
    args = command(python, script)  # type: ignore[operator]
    if recorded:
        args = [python, "-m", "ddpviz", "record", "--out", str(out / "traces"), "--", *args]
    done = subprocess.run(args, env=job, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"ddpviz: benchmark job failed ({' '.join(args)}):\n"
                         f"{(done.stdout + done.stderr)[-3000:]}")
    report: dict[str, Any] = json.loads((out / "reports" / "rank0.json").read_text())
    return report


def step_time(python: str, script: str, command: object, extra: dict[str, str],
              steps: int, recorded: bool, tmp: Path) -> tuple[float, float]:
    """Median wall time and median training-thread CPU time of rank 0's steps."""
    report = run_job(python, script, command, extra, steps, tmp, recorded=recorded)
    times, cpu = report["step_s"][WARMUP:], report["step_cpu_s"][WARMUP:]
    if not times:
        raise SystemExit(f"ddpviz: {script} reported no step times past the warm-up")
    return statistics.median(times), statistics.median(cpu)


def in_process(python: str, script: str, command: object, extra: dict[str, str], blocks: int,
               block: int, tmp: Path) -> dict[str, float]:
    """One job that watches its DDP in every other block of steps: rank 0's step times."""
    steps = WARMUP + blocks * block
    report = run_job(python, script, command, extra, steps, tmp, timeout=900,
                     FW_TOGGLE=str(block), FW_TOGGLE_FROM=str(WARMUP))
    times, cpu, watched = report["step_s"], report["step_cpu_s"], report["watched"]
    if len(watched) != len(times) or len(times) < steps:
        raise SystemExit(f"ddpviz: {script} reported {len(times)} steps, wanted {steps}")
    steady: dict[bool, list[int]] = {False: [], True: []}
    sampled: list[int] = []  # a fresh watch's first SETTLE steps
    for i in range(WARMUP, len(times)):
        if (i - WARMUP) % block >= SETTLE:
            steady[watched[i]].append(i)
        elif watched[i]:
            sampled.append(i)
    row: dict[str, float] = {}
    for key, series in (("wall", times), ("cpu", cpu)):
        off = statistics.median(series[i] for i in steady[False])
        on = statistics.median(series[i] for i in steady[True])
        # per pair of neighbouring blocks (unwatched, watched): the spread of the ratio
        pairs = []
        for b in range(0, blocks - 1, 2):
            lo, hi = WARMUP + b * block, WARMUP + (b + 1) * block
            a = [series[i] for i in range(lo + SETTLE, hi)]
            w = [series[i] for i in range(hi + SETTLE, hi + block)]
            pairs.append(statistics.median(w) / statistics.median(a))
        row |= {f"{key}_off": off, f"{key}_on": on, f"{key}_ratio": on / off,
                f"{key}_lo": min(pairs), f"{key}_hi": max(pairs),
                f"{key}_sampled": statistics.median(series[i] for i in sampled) / off}
    return row


def main_in_process(args: argparse.Namespace, python: str, tmp: Path) -> None:
    rows = []
    for name, (script, command, extra) in FRAMEWORKS.items():
        print(f"  {name}: {args.blocks} blocks of {args.block} steps ...", file=sys.stderr)
        rows.append((name, in_process(python, script, command, extra, args.blocks, args.block,
                                      tmp)))
    print(f"\nstep time inside one job, rank 0 (2 gloo ranks, CPU): watch() on in every other "
          f"block of {args.block} steps, median over each block's steps {SETTLE}..; 'sampled': "
          f"a fresh watch's steps 0-{SETTLE - 1} (per-parameter hooks) against unwatched")
    print(f"{'framework':<34}{'unwatched':>11}{'watched':>11}{'ratio':>8}  {'block pairs':<12}"
          f"{'sampled':>8}")
    for name, r in rows:
        for key, what in (("wall", "wall"), ("cpu", "thread CPU")):
            print(f"{name + ', ' + what:<34}{r[key + '_off'] * 1e3:>8.2f} ms"
                  f"{r[key + '_on'] * 1e3:>8.2f} ms{r[key + '_ratio']:>8.3f}  "
                  f"{r[key + '_lo']:.2f}-{r[key + '_hi']:.2f}   {r[key + '_sampled']:>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--in-process", action="store_true",
                        help="watch and unwatch blocks of steps inside one job")
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--block", type=int, default=12)
    parser.add_argument("--only", default="", help="the frameworks whose name contains this")
    args = parser.parse_args()
    for name in [n for n in FRAMEWORKS if args.only.lower() not in n.lower()]:
        del FRAMEWORKS[name]
    os.environ.pop("DDPVIZ_RECORD", None)
    if args.in_process:
        if args.blocks < 2 or args.blocks % 2 or args.block <= SETTLE:
            parser.error(f"--blocks must be even and >= 2, --block > {SETTLE}")
        with tempfile.TemporaryDirectory() as folder:
            main_in_process(args, sys.executable, Path(folder))
        return
    with tempfile.TemporaryDirectory() as folder:
        tmp = Path(folder)
        python = hooked_python(tmp)
        rows = []
        for name, (script, command, extra) in FRAMEWORKS.items():
            plain: list[tuple[float, float]] = []
            recorded: list[tuple[float, float]] = []
            for rep in range(args.reps):
                for rec in ((False, True) if rep % 2 == 0 else (True, False)):
                    t = step_time(python, script, command, extra, args.steps, rec, tmp)
                    (recorded if rec else plain).append(t)
                print(f"  {name}: repetition {rep + 1}/{args.reps}: unrecorded "
                      f"{plain[-1][0] * 1e3:.2f} ms ({plain[-1][1] * 1e3:.2f} ms CPU), "
                      f"recorded {recorded[-1][0] * 1e3:.2f} ms "
                      f"({recorded[-1][1] * 1e3:.2f} ms CPU)", file=sys.stderr)
            for i, what in ((0, "wall"), (1, "training-thread CPU")):
                ratios = [r[i] / p[i] for r, p in zip(recorded, plain, strict=True)]
                rows.append((f"{name}, {what}", statistics.median(p[i] for p in plain),
                             statistics.median(r[i] for r in recorded),
                             statistics.median(ratios), min(ratios), max(ratios)))
    print(f"\nstep time inside the job, rank 0, median over steps {WARMUP}..{args.steps - 1} "
          f"and over {args.reps} alternating repetitions (2 gloo ranks, CPU); the training "
          "thread's CPU time leaves out waiting for a core or a peer")
    print(f"{'framework':<42}{'unrecorded':>12}{'recorded':>12}{'ratio':>8}  range")
    for name, p, r, ratio, lo, hi in rows:
        print(f"{name:<42}{p * 1e3:>9.2f} ms{r * 1e3:>9.2f} ms{ratio:>8.2f}  {lo:.2f}-{hi:.2f}")


if __name__ == "__main__":
    main()
