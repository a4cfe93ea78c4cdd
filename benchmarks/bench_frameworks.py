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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.frameworks.harness import job_env, plain_python, torchrun  # noqa: E402
from tests.record.hooked import hooked_python  # noqa: E402

WARMUP = 5  # steps left out: the first steps build buckets, rebuild them, warm caches
FRAMEWORKS = {
    "HF Trainer (torchrun)": ("hf_trainer.py", torchrun, {}),
    "Lightning ddp": ("lightning_job.py", plain_python, {"FW_STRATEGY": "ddp"}),
}


def step_time(python: str, script: str, command: object, extra: dict[str, str],
              steps: int, recorded: bool, tmp: Path) -> tuple[float, float]:
    """Median wall time and median training-thread CPU time of rank 0's steps."""
    from tests.dist.harness import free_port

    out = Path(tempfile.mkdtemp(dir=tmp))
    env = job_env(out, FW_OUT=str(out / "reports"), FW_STEPS=str(steps),
                  MASTER_PORT=str(free_port()), **extra)
    args = command(python, script)  # type: ignore[operator]
    if recorded:
        args = [python, "-m", "ddpviz", "record", "--out", str(out / "traces"), "--", *args]
    done = subprocess.run(args, env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"ddpviz: benchmark job failed ({' '.join(args)}):\n"
                         f"{(done.stdout + done.stderr)[-3000:]}")
    report = json.loads((out / "reports" / "rank0.json").read_text())
    times, cpu = report["step_s"][WARMUP:], report["step_cpu_s"][WARMUP:]
    if not times:
        raise SystemExit(f"ddpviz: {script} reported no step times past the warm-up")
    return statistics.median(times), statistics.median(cpu)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    os.environ.pop("DDPVIZ_RECORD", None)
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
