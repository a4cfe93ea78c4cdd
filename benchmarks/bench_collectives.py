"""What the ledger of the job's own collectives costs (issue #34): probes/collectives.py records
every collective the job issues through torch.distributed, collective_check.py compares them
across ranks from a daemon thread.

Three numbers, all measured side by side in one run on real gloo ranks:
1. one small all_reduce (1 float) through the ledger's wrapper, recording, against the same
   call to torch's function (the wrapper's original), in interleaved blocks: us per call;
2. one comparison (`CollectiveCheck.tick()` on rank 0: post, read every rank's new entries,
   compare) after N collectives per rank: ms per tick;
3. bench_watch.py's models trained with ONE EXTRA small all_reduce per step (a metric), under
   the default `ddpviz.watch(ddp)` (ledger on) against torch's DDP with the same extra call
   unrecorded: the step-time ratio, training thread's CPU and wall, median over repetitions.

    PYTHONPATH=. python benchmarks/bench_collectives.py [--reps 100] [--worlds 2,3]
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

from _ranks import interleaved_blocks, join_gloo, run_ranks
from bench_watch import MODELS, WARMUP_BLOCKS, _median_interval, _model

CALLS = 200  # per block of the per-call measurement


def _per_call(reps: int, sizes: tuple[int, ...] = (1,)) -> tuple[float, float]:
    """us per call, torch's and recorded; `sizes`: the all_reduce's element counts, cycled
    call by call (more than one: every call changes its site's signature, See [Note: a known
    call site that changed] in ddpviz/probes/collective_check.py)."""
    from ddpviz.probes import collectives

    recorded = dist.all_reduce
    plain = recorded.__ddpviz_original__  # type: ignore[attr-defined]
    ts = [torch.ones(n) for n in sizes]
    times: dict[str, list[float]] = {"plain": [], "recorded": []}
    for rep in range(reps):
        order = [("plain", plain), ("recorded", recorded)]
        for name, fn in order if rep % 2 else order[::-1]:
            dist.barrier()
            start = time.perf_counter()
            for i in range(CALLS):
                fn(ts[i % len(ts)])
            times[name].append((time.perf_counter() - start) / CALLS * 1e6)
    assert collectives.enabled()
    return statistics.median(times["plain"]), statistics.median(times["recorded"])


def _tick_cost(rank: int, n: int) -> float:
    from ddpviz.probes import collective_check

    check = collective_check._check
    assert check is not None
    check.stop()  # this run ticks by hand
    t = torch.ones(1)
    costs = []
    for _ in range(5):
        for _ in range(n):
            dist.all_reduce(t)
        dist.barrier()
        start = time.perf_counter()
        check.tick()
        costs.append((time.perf_counter() - start) * 1e3)
        dist.barrier()
    return statistics.median(costs)


def _rank(rank: int, world: int, port: int, args: Any, out: Any) -> None:
    import ddpviz

    join_gloo(rank, world, port)
    rows = []
    t = torch.ones(1)
    for model_name, dims in MODELS.items():
        variants: dict[str, nn.Module] = {}
        extra: dict[str, Any] = {}
        watches = []
        for name in ("torch DDP", "torch DDP (A/A)", "watch() default"):
            ddp = nn.parallel.DistributedDataParallel(_model(dims))
            if name.startswith("watch"):
                watches.append(ddpviz.watch(ddp))
            variants[name] = ddp
        plain = getattr(dist.all_reduce, "__ddpviz_original__", dist.all_reduce)
        for name in variants:
            fn = dist.all_reduce if name.startswith("watch") else plain
            extra[name] = lambda fn=fn: fn(t)
        timings = interleaved_blocks(variants, rank, dims, reps=args.reps, block=args.block,
                                     warmup=WARMUP_BLOCKS, after_step=extra)
        rows.append((model_name, timings.wall, timings.thread))
        if model_name == list(MODELS)[-1]:
            per_call = (_per_call(max(10, args.reps // 5)),
                        _per_call(max(10, args.reps // 5), sizes=(1, 2)))
            ticks = {n: _tick_cost(rank, n) for n in (10, 100, 1000)}
        for w in watches:
            w.close()
    out.put((rank, (rows, per_call, ticks)))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=100)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--worlds", default="2")
    args = parser.parse_args()
    print("| ranks | model | variant (one extra all_reduce a step) | step us | thread CPU / "
          "torch (95%) | wall / torch |")
    print("|---|---|---|---:|---:|---:|")
    summary = []
    for world in (int(w) for w in args.worlds.split(",")):
        rows, per_call, ticks = run_ranks(_rank, world, args)[0]
        for model_name, wall, thread in rows:
            for name in wall:
                step_us = statistics.median(wall[name]) / args.block * 1e6
                ratios = np.array(thread[name]) / np.array(thread["torch DDP"])
                lo, hi = _median_interval(ratios)
                wall_ratio = np.median(np.array(wall[name]) / np.array(wall["torch DDP"]))
                print(f"| {world} | {model_name} | {name} | {step_us:.0f} | "
                      f"{np.median(ratios):.3f} ({lo:.3f}-{hi:.3f}) | {wall_ratio:.3f} |")
        summary.append((world, per_call, ticks))
    print()
    print("| ranks | all_reduce(1 float) us: torch's | recorded | cost of recording one | "
          "size changing every call (1, 2 floats): torch's | recorded | cost | "
          "one comparison (tick) ms after 10 / 100 / 1000 collectives a rank |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for world, ((plain, recorded), (plain_c, recorded_c)), ticks in summary:
        print(f"| {world} | {plain:.1f} | {recorded:.1f} | {recorded - plain:.1f} | "
              f"{plain_c:.1f} | {recorded_c:.1f} | {recorded_c - plain_c:.1f} | "
              f"{ticks[10]:.2f} / {ticks[100]:.2f} / {ticks[1000]:.2f} |")


if __name__ == "__main__":
    main()
