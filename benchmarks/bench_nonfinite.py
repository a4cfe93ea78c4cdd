"""What the non-finite checks (probes/nonfinite.py) cost per step on torch's DDP (CPU, gloo),
side by side, with bench_watch.py's method and models (~100 and ~10,000 parameters): inside
the same rank processes, DDP copies train in rotated blocks of steps; each row is the median
over repetitions of its block time / plain torch DDP's block time.

Rows: torch DDP (and an A/A copy: the noise floor), watch() at the default recording with the
checks (as shipped) and with them turned off (the check alone = the difference), the default
without its every-step checks ("sampled only": the default before them; See [Note: every step,
one hook a bucket] in probes/nonfinite_buckets.py) and with the bucket hooks but not the forward
output's sum ("buckets only"), the default in its precise mode (every local gradient checked on
every step, as for PRECISE_FOR steps after something went non-finite) next to `every=1` without
checks (the hooks alone), and the guarded level with and without the checks.

    PYTHONPATH=. python benchmarks/bench_nonfinite.py [--reps 200] [--block 5] [--worlds 2,3]
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

VARIANTS = ["torch DDP", "torch DDP (A/A)", "default", "default, no check",
            "default, sampled only", "default, buckets only", "default, precise",
            "every=1, no check", "guard", "guard, no check"]


def _no_check(w: Any) -> None:
    """Turn a watch's non-finite checks off (what the watch costs without them)."""
    nf = w._nf
    nf.forward = lambda step, output, armed=False: False
    nf.grad = lambda step, index, grad: None
    nf.bucket = lambda step, indices, buffer, views: None
    _no_every_step(w)


def _no_every_step(w: Any) -> None:
    """Turn the hook-less default's every-step checks off (its bucket hooks and the output's
    sum): the default as it was before them, checking on sampled steps only."""
    each = w.__dict__.get("_buckets_nf")
    if each is not None:
        each.close()
        each.output = lambda step, output: None


def _no_output_sum(w: Any) -> None:
    """The every-step bucket hooks without the forward output's sum."""
    each = w.__dict__.get("_buckets_nf")
    if each is not None:
        each.output = lambda step, output: None


def _rank(rank: int, world: int, port: int, args: Any, out: Any) -> None:
    import ddpviz

    VARIANTS[:] = args.variants_list
    join_gloo(rank, world, port)
    rows = []
    for model_name, dims in MODELS.items():
        variants: dict[str, nn.Module] = {}
        watches = []
        for name in VARIANTS:
            ddp = nn.parallel.DistributedDataParallel(_model(dims))
            if not name.startswith("torch"):
                rec = ddpviz.Recording(guard=name.startswith("guard"),
                                       every=1 if name.startswith("every=1") else 100)
                w = ddpviz.watch(ddp, recording=rec)
                if name.endswith("no check"):
                    _no_check(w)
                if name.endswith("sampled only"):
                    _no_every_step(w)
                if name.endswith("buckets only"):
                    _no_output_sum(w)
                if name.endswith("precise"):
                    w._nf._precise_until = 1 << 62
                watches.append(w)
            variants[name] = ddp
        blocks, _, thread = interleaved_blocks(
            {n: variants[n] for n in VARIANTS}, rank, dims, reps=args.reps, block=args.block,
            warmup=WARMUP_BLOCKS)
        for w in watches:
            w.close()
        rows.append({"model": model_name, "blocks": blocks, "thread": thread})
    out.put((rank, rows))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--worlds", default="2,3")
    parser.add_argument("--variants", default=";".join(VARIANTS),
                        help="';'-separated subset of the rows (torch DDP always)")
    args = parser.parse_args()
    chosen = [v for v in args.variants.split(";") if v in VARIANTS]
    VARIANTS[:] = ["torch DDP"] + [v for v in chosen if v != "torch DDP"]
    args.variants_list = list(VARIANTS)  # (the spawned ranks import this module afresh)
    print(f"non-finite checks on torch DDP, gloo on CPU, 1 thread/rank, batch 16, SGD, blocks "
          f"of {args.block} steps, {args.reps} rotated repetitions, rank 0; ratio = median of "
          "block time / torch DDP's (bootstrap 95% interval); thread = the training thread's "
          "CPU time")
    print(f"{'ranks':>5}  {'model':12} {'variant':20}{'step us':>9}{'wall':>7}"
          f"{'95% interval':>15}{'thread':>8}{'95% interval':>15}")
    for world in (int(w) for w in args.worlds.split(",")):
        for row in run_ranks(_rank, world, args, timeout=3600)[0]:
            for name in VARIANTS:
                step_us = statistics.median(row["blocks"][name]) / args.block * 1e6
                cells = []
                for kind in ("blocks", "thread"):
                    ratios = np.array(row[kind][name]) / np.array(row[kind]["torch DDP"])
                    lo, hi = _median_interval(ratios)
                    cells.append(f"{np.median(ratios):>7.3f}{lo:>9.3f}-{hi:.3f}")
                print(f"{world:>5}  {row['model']:12} {name:20}{step_us:>9.0f}{''.join(cells)}")


if __name__ == "__main__":
    main()
