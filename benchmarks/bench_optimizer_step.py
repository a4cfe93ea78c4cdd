"""What timing the optimizer step (probes/optimizer_step.py) costs watch() per step, on torch's
DDP (CPU, gloo), side by side.

In the same rank processes, copies of one model train in alternating blocks of steps (the
order rotating every repetition; benchmarks/_ranks.py): torch's DDP alone, and watch() with
the tap on and with it off (a tap whose events are off: `arm()` does nothing); once at the
default recording (`every=100`: the tap registers torch's global optimizer hooks on the
sampled steps only) and once, in fresh processes (the hooks of a copy fire on every
optimizer's step in the process), at `every=1` (every step sampled: the hooks stay
registered and fire each step).
Events go to an emitter that drops them. Printed: the median over repetitions of each copy's
block time / the plain copy's, for the training thread's CPU time and the process's, and the
tap's cost per step in us (on - off, medians of the per-block differences).

    PYTHONPATH=. python benchmarks/bench_optimizer_step.py [--reps 200] [--block 5] [--world 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's ddpviz
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ranks import interleaved_blocks, join_gloo, mlp, run_ranks

DIMS = (64, 256, 256, 256, 8)


def _model() -> nn.Module:
    return mlp(DIMS)


def _rank(rank: int, world: int, port: int, every: int, reps: int, block: int, out: Any
          ) -> None:
    import ddpviz
    from ddpviz import events as ev
    from ddpviz.probes.optimizer_step import OptimizerStepTap
    from ddpviz.recording import Recording

    join_gloo(rank, world, port)
    variants: dict[str, Any] = {"torch DDP": nn.parallel.DistributedDataParallel(_model())}
    watches = []
    for tap in ("on", "off"):
        ddp = nn.parallel.DistributedDataParallel(_model())
        w = ddpviz.watch(ddp, emitter=lambda e: None, recording=Recording(every=every))
        if tap == "off":
            w._opt = OptimizerStepTap(ev.Tap(), [])  # events off: arm() does nothing
        watches.append(w)
        variants[f"watch every={every}, tap {tap}"] = ddp
    t = interleaved_blocks(variants, rank, DIMS, reps=reps, block=block, warmup=5)
    for w in watches:
        w.close()
    out.put((rank, (t.thread, t.cpu)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--world", type=int, default=2)
    args = parser.parse_args()
    print(f"{args.world} gloo ranks, rank 0, {args.reps} blocks of {args.block} steps")
    print(f"{'copy':<26} {'thread CPU / torch':>18} {'process CPU / torch':>20}")
    for every in (100, 1):
        thread, cpu = run_ranks(_rank, args.world, every, args.reps, args.block)[0]
        base_t, base_c = thread["torch DDP"], cpu["torch DDP"]
        for name in thread:
            rt = statistics.median(a / b for a, b in zip(thread[name], base_t, strict=True))
            rc = statistics.median(a / b for a, b in zip(cpu[name], base_c, strict=True))
            print(f"{name:<26} {rt:>18.3f} {rc:>20.3f}")
        on, off = thread[f"watch every={every}, tap on"], thread[f"watch every={every}, tap off"]
        d = statistics.median(a - b for a, b in zip(on, off, strict=True)) / args.block * 1e6
        step_us = statistics.median(base_t) / args.block * 1e6
        print(f"  tap on - off: {d:+.1f} us a step (training-thread CPU, median of per-block "
              f"differences; torch DDP's step {step_us:.0f} us)")


if __name__ == "__main__":
    main()
