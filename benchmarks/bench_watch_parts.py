"""Where watch()'s default recording spends its per-step cost (issue #24's cost item).

bench_watch.py's models, step sizes and interleaved blocks, with the default recording taken
apart: torch's DDP alone, an A/A copy, the default `ddpviz.watch(ddp)`, the default without
its every-step NaN check ("no NaN check": See [Note: every step, one hook a bucket] in
probes/nonfinite_buckets.py) or without its backward marks ("no marks": See [Note: backward
marks]), each alone, and the default less one piece after another ("no replicas":
Recording(replicas=None); "no sampling": every=None too; "no pulse": hang_timeout=0 too, i.e.
no heartbeat thread either). Printed for rank 0: the training thread's CPU time ratio to
torch's DDP (median over repetitions, bootstrap 95% interval of that median), the process's
CPU ratio (all threads: the daemon threads' cost) and the elapsed time's ratio.

    PYTHONPATH=. python benchmarks/bench_watch_parts.py [--reps 200] [--worlds 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's ddpviz

from _ranks import interleaved_blocks, join_gloo, run_ranks
from bench_watch import MODELS, WARMUP_BLOCKS, _median_interval, _model

VARIANTS = ["torch DDP", "torch DDP (A/A)", "default", "no NaN check", "no marks", "no replicas",
            "no sampling", "no pulse"]


def _watch(ddp: nn.parallel.DistributedDataParallel, name: str) -> Any:
    import ddpviz

    if name == "default":
        return ddpviz.watch(ddp)
    if name in ("no NaN check", "no marks"):
        w = ddpviz.watch(ddp)  # (its every-step check and marks are built by now)
        if name == "no marks":  # (their hook removed for good: an error stops them)
            w._marks.remove()
            w._marks.error = RuntimeError("bench_watch_parts: no marks")
        else:
            w._buckets_nf.close()
        return w
    if name == "no replicas":
        return ddpviz.watch(ddp, recording=ddpviz.Recording(replicas=None))
    if name == "no sampling":
        return ddpviz.watch(ddp, recording=ddpviz.Recording(every=None, replicas=None))
    return ddpviz.watch(ddp, hang_timeout=0,
                        recording=ddpviz.Recording(every=None, replicas=None))


def _rank(rank: int, world: int, port: int, args: Any, out: Any) -> None:
    join_gloo(rank, world, port)
    rows = []
    for model_name, dims in MODELS.items():
        variants: dict[str, nn.Module] = {}
        watches = []
        for name in args.variants:
            ddp = nn.parallel.DistributedDataParallel(_model(dims))
            if not name.startswith("torch DDP"):
                watches.append(_watch(ddp, name))
            variants[name] = ddp
        timings = interleaved_blocks(variants, rank, dims, reps=args.reps, block=args.block,
                                     warmup=WARMUP_BLOCKS)
        for w in watches:
            w.close()
        rows.append((model_name, timings.wall, timings.cpu, timings.thread))
    out.put((rank, rows))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--worlds", default="2")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    args.variants = args.variants.split(",")
    print(f"{'ranks':>5}  {'model':12} {'variant':22}{'step us':>9}{'thread':>8}"
          f"{'95% interval':>15}{'cpu':>8}{'95% interval':>15}{'wall':>8}{'95% interval':>15}")
    for world in (int(w) for w in args.worlds.split(",")):
        for model_name, wall, cpu, thread in run_ranks(_rank, world, args)[0]:
            for name in args.variants:
                step_us = statistics.median(wall[name]) / args.block * 1e6
                cells = []
                for kind in (thread, cpu, wall):
                    ratios = np.array(kind[name]) / np.array(kind["torch DDP"])
                    lo, hi = _median_interval(ratios)
                    cells.append(f"{np.median(ratios):>8.3f}{lo:>9.3f}-{hi:.3f}")
                print(f"{world:>5}  {model_name:12} {name:22}{step_us:>9.0f}{''.join(cells)}")


if __name__ == "__main__":
    main()
