"""What arming the debugger (ddpviz/debugger/) costs a step of ddpviz's DDP, side by side: CPU,
gloo, in the same rank processes.

Copies of one model train in alternating blocks of steps (the order rotating every repetition;
benchmarks/_ranks.py): ddpviz's DDP without a debugger, with one installed but never commanded
(unarmed: one attribute test at each safe point), and with one armed by an `Arm` command and
no break set (each forward reads the agreed boundary from the store: one TCPStore round trip a
step, never met). Events go to an emitter that drops them. Printed: the median over
repetitions of each copy's block wall time / the plain copy's, and the armed copy's extra per
step in us (median of the per-block differences). Not a test: a measurement to read.

    PYTHONPATH=. python benchmarks/bench_debugger.py [--reps 100] [--block 5] [--world 2]
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


def _rank(rank: int, world: int, port: int, reps: int, block: int, out: Any) -> None:
    import ddpviz
    from ddpviz.debugger import controller
    from ddpviz.debugger.protocol import Arm

    join_gloo(rank, world, port)

    def drop(event: Any) -> None:
        pass

    variants: dict[str, Any] = {}
    variants["ddpviz DDP"] = ddpviz.DistributedDataParallel(_model())
    unarmed = controller.Controller(drop, rank)
    controller._current = unarmed  # what install() sets; the DDP built next attaches to it
    variants["debugger unarmed"] = ddpviz.DistributedDataParallel(_model())
    armed = controller.Controller(drop, rank)
    armed.receive((Arm(1),))  # armed at its first forward
    controller._current = armed
    variants["debugger armed"] = ddpviz.DistributedDataParallel(_model())
    controller._current = None
    t = interleaved_blocks(variants, rank, DIMS, reps=reps, block=block, warmup=5)
    assert armed.armed and not unarmed.armed and not armed.parked
    out.put((rank, t.wall))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--world", type=int, default=2)
    args = parser.parse_args()
    wall = run_ranks(_rank, args.world, args.reps, args.block)[0]
    base = wall["ddpviz DDP"]
    print(f"{args.world} gloo ranks, rank 0, {args.reps} blocks of {args.block} steps")
    print(f"{'copy':<20} {'wall / ddpviz DDP':>18}")
    for name, times in wall.items():
        ratio = statistics.median(a / b for a, b in zip(times, base, strict=True))
        print(f"{name:<20} {ratio:>18.3f}")
    d = statistics.median(a - b for a, b in zip(wall["debugger armed"], base, strict=True))
    step_us = statistics.median(base) / args.block * 1e6
    print(f"  armed - plain: {d / args.block * 1e6:+.1f} us a step (wall, median of per-block "
          f"differences; the plain step {step_us:.0f} us)")


if __name__ == "__main__":
    main()
