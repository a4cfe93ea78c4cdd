"""What ddpviz.watch() costs per step on torch's own DDP (CPU, gloo), side by side.

Inside the same rank processes, several DDP copies of one model train in alternating blocks of
steps (the order rotates every repetition, so noise from other processes hits them alike):
torch's DDP alone, a second unwatched copy (A/A: the noise floor of the ratios), and watched
copies at each detail level ("full": a GradReady per parameter tensor; "sampled", the default:
full on a few steps, per-bucket summaries otherwise; "buckets": summaries only; "steps": no comm
hook, per-forward only). Printed per world size, threads per rank and
model: the median plain step time and the median over repetitions of each copy's block time /
the plain copy's block time, for elapsed time and for the process's CPU time.

    PYTHONPATH=. python benchmarks/bench_watch.py [--reps 40] [--block 20]
        [--worlds 2,3] [--threads 1,2] [--baseline-watch OLD_WATCH.py]

--baseline-watch loads another watch.py (e.g. `git show <rev>:ddpviz/watch.py > /tmp/w.py`)
and adds a row for it, to compare against a previous version.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's ddpviz

from _ranks import run_ranks

MODELS = {
    "~100 params": (8, 8, 4),  # Linear(8, 8) + Linear(8, 4): 108 parameters
    "~10k params": (64, 96, 40),  # Linear(64, 96) + Linear(96, 40): 10,120 parameters
}
WARMUP_BLOCKS = 2


def _model(dims: tuple[int, int, int]) -> nn.Module:
    torch.manual_seed(0)
    d_in, hidden, d_out = dims
    return nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU(), nn.Linear(hidden, d_out))


def _load_watch(path: str | None) -> Any:
    if path is None:
        return None
    spec = importlib.util.spec_from_file_location("baseline_watch", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.watch


def _rank(rank: int, world: int, port: int, args: Any, out: Any) -> None:
    import ddpviz

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    baseline = _load_watch(args.baseline_watch)
    rows: list[dict[str, Any]] = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        for model_name, dims in MODELS.items():
            variants: dict[str, nn.Module] = {}
            names = ["torch DDP", "torch DDP (A/A)", "watch detail=full",
                     "watch detail=sampled", "watch detail=buckets", "watch detail=steps"]
            names += ["baseline watch"] if baseline else []
            watches = []
            for name in names:
                ddp = nn.parallel.DistributedDataParallel(_model(dims))
                if name.startswith("watch detail="):
                    watches.append(ddpviz.watch(ddp, detail=name.split("=")[1]))  # type: ignore[arg-type]
                elif name == "baseline watch":
                    watches.append(baseline(ddp))
                variants[name] = ddp
            opts = {n: torch.optim.SGD(m.parameters(), lr=0.01) for n, m in variants.items()}
            g = torch.Generator().manual_seed(rank)
            x, y = torch.randn(16, dims[0], generator=g), torch.randn(16, dims[2], generator=g)
            blocks: dict[str, list[float]] = {n: [] for n in names}
            cpu: dict[str, list[float]] = {n: [] for n in names}
            for rep in range(WARMUP_BLOCKS + args.reps):
                order = names[rep % len(names):] + names[:rep % len(names)]
                for name in order:
                    model, opt = variants[name], opts[name]
                    dist.barrier()
                    start, start_cpu = time.perf_counter(), time.process_time()
                    for _ in range(args.block):
                        nn.functional.mse_loss(model(x), y).backward()
                        opt.step()
                        opt.zero_grad()
                    if rep >= WARMUP_BLOCKS:
                        blocks[name].append(time.perf_counter() - start)
                        cpu[name].append(time.process_time() - start_cpu)
            for w in watches:
                w.close()
            rows.append({"threads": threads, "model": model_name, "blocks": blocks, "cpu": cpu})
    out.put((rank, rows))
    dist.destroy_process_group()


def _run_world(world: int, args: Any) -> list[dict[str, Any]]:
    return run_ranks(_rank, world, args, timeout=1800)[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--block", type=int, default=20)
    parser.add_argument("--worlds", default="2,3")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--baseline-watch", default=None)
    args = parser.parse_args()
    args.threads = [int(t) for t in args.threads.split(",")]
    print(f"watch() cost on torch DDP, gloo on CPU, batch 16, SGD, blocks of {args.block} "
          f"steps, {args.reps} rotated repetitions, rank 0; ratio = median over repetitions of "
          "block time / torch DDP's block time (quartiles)")
    print("wall: elapsed time; cpu: the rank process's CPU time (all its threads), steadier on "
          "a loaded machine")
    print(f"{'ranks':>5} {'thr':>3}  {'model':12} {'variant':22}{'step us':>9}{'wall':>7}"
          f"{'quartiles':>14}{'cpu':>8}{'quartiles':>14}")
    for world in (int(w) for w in args.worlds.split(",")):
        for row in _run_world(world, args):
            for name, times in row["blocks"].items():
                step_us = statistics.median(times) / args.block * 1e6
                cells = []
                for kind in ("blocks", "cpu"):
                    base = row[kind]["torch DDP"]
                    ratios = [a / b for a, b in zip(row[kind][name], base, strict=True)]
                    q = statistics.quantiles(ratios, n=4)
                    cells.append(f"{statistics.median(ratios):>7.3f}{q[0]:>8.3f}-{q[2]:.3f}")
                print(f"{world:>5} {row['threads']:>3}  {row['model']:12} {name:22}"
                      f"{step_us:>9.0f}{''.join(cells)}")


if __name__ == "__main__":
    main()
