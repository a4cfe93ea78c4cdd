"""What the replica check (docs/replicas.md) costs per step on torch's DDP (CPU, gloo), side by
side, measured like bench_watch.py (whose models, rotation and ratios it reuses): inside the
same rank processes, DDP copies of one model train in alternating blocks of steps, and each
copy's block time is divided by plain torch DDP's.

Copies: torch DDP alone, a second unwatched copy (A/A: the noise floor), watch() at the default
recording without the replica check (`replicas=never`), with it every 100th step (the old
default), every 25th (the default), every 16th, and every step (`replicas=1`, the precise
mode, also what the check does for one period after it saw a divergence or a checkpoint), and
the guarded recording without the check and at the default. Then, per
model, the whole digest work of one checked step (parameters and gradients: the snapshot the
training thread takes and the digest the check's thread computes), alone in one process.

    PYTHONPATH=. python benchmarks/bench_replicas.py [--reps 300] [--block 5] [--worlds 2,3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's ddpviz
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ranks import interleaved_blocks, join_gloo, run_ranks
from bench_watch import MODELS, WARMUP_BLOCKS, _median_interval, _model

VARIANTS = {
    "torch DDP": None, "torch DDP (A/A)": None,
    "watch, no check": "every=100,replicas=never",
    "watch, check /100": "every=100,replicas=100",
    "watch, check /25 (default)": "every=100,replicas=25",
    "watch, check /16": "every=100,replicas=16",
    "watch, check every step": "every=100,replicas=1",
    "guard, no check": "guard,every=100,replicas=never",
    "guard, check /25 (default)": "guard,every=100,replicas=25",
}


def _rank(rank: int, world: int, port: int, args: Any, out: Any) -> None:
    import ddpviz

    join_gloo(rank, world, port)
    rows: list[dict[str, Any]] = []
    names = list(VARIANTS)
    for model_name, dims in MODELS.items():
        variants: dict[str, nn.Module] = {}
        watches = []
        for name, spelled in VARIANTS.items():
            ddp = nn.parallel.DistributedDataParallel(_model(dims))
            if spelled is not None:
                watches.append(ddpviz.watch(ddp, recording=ddpviz.Recording.parse(spelled)))
            variants[name] = ddp
        blocks, _, thread = interleaved_blocks(
            {n: variants[n] for n in names}, rank, dims, reps=args.reps, block=args.block,
            warmup=WARMUP_BLOCKS)
        for w in watches:
            found = w.replicas.findings if w.replicas is not None else []
            assert not found, found  # a healthy run: nothing to report
            w.close()
        rows.append({"model": model_name, "blocks": blocks, "thread": thread,
                     "digest_us": _digest_us(variants["torch DDP"])})
    out.put((rank, rows))
    dist.destroy_process_group()


def _digest_us(model: nn.Module) -> float:
    """The training thread's time for one checked step's digests (parameters + gradients)."""
    from ddpviz.probes.digest import digest_tensors

    params = list(model.parameters())
    for p in params:
        p.grad = torch.ones_like(p)
    times = []
    for _ in range(200):
        start = time.perf_counter()
        digest_tensors(params)
        digest_tensors([p.grad for p in params])
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--worlds", default="2,3")
    args = parser.parse_args()
    print(f"replica check cost on torch DDP under watch(), gloo on CPU, batch 16, SGD, blocks "
          f"of {args.block} steps, {args.reps} rotated repetitions, rank 0; ratio = median over "
          "repetitions of block time / torch DDP's block time (bootstrap 95% interval); "
          "thread: the training thread's CPU time")
    print(f"{'ranks':>5}  {'model':12} {'variant':28}{'step us':>9}{'wall':>7}"
          f"{'95% interval':>15}{'thread':>8}{'95% interval':>15}")
    for world in (int(w) for w in args.worlds.split(",")):
        for row in run_ranks(_rank, world, args, timeout=3600)[0]:
            for name, times in row["blocks"].items():
                step_us = statistics.median(times) / args.block * 1e6
                cells = []
                for kind in ("blocks", "thread"):
                    ratios = np.array(row[kind][name]) / np.array(row[kind]["torch DDP"])
                    lo, hi = _median_interval(ratios)
                    cells.append(f"{np.median(ratios):>7.3f}{lo:>9.3f}-{hi:.3f}")
                print(f"{world:>5}  {row['model']:12} {name:28}{step_us:>9.0f}{''.join(cells)}")
            print(f"{world:>5}  {row['model']:12} {'(digests of one step alone)':28}"
                  f"{row['digest_us']:>9.0f} us")


if __name__ == "__main__":
    main()
