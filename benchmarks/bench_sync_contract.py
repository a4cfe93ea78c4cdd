"""What the gradient-sync contract (ddpviz/probes/sync_contract.py) costs, side by side.

Part 1, its pieces one by one (one process, a world of one; the best of 7 timeit runs, so warm
caches): a forward's bookkeeping (synced; under no_sync(), which notes the forward's call
site), a canary hook called after a synced forward (the usual backward), the collectives count
read once per backward that leaves dirt, the optimizer-step hook with nothing to judge, and a
backward of a 4-layer MLP (8 parameter tensors) with the contract's canaries (CANARIES)
against none (what calling them from autograd's C++ costs).

Part 2, per step on 2 gloo ranks, bench_watch.py's interleaved blocks: torch's DDP, an A/A
copy, the default `ddpviz.watch(ddp)`, and the same watch with its contract closed ("no
contract": no canary hooks; the forward's one call stays, and the step hooks, which the other
watch keeps registered, run for every variant alike); each once with one
backward per step and once with gradient accumulation (4 micro-batches, the first 3 under
no_sync(): every step leaves dirt that the 4th clears). Printed for rank 0: the training
thread's CPU time ratio to torch's DDP (median over repetitions, bootstrap 95% interval) and
the process's CPU ratio.

    PYTHONPATH=. python benchmarks/bench_sync_contract.py [--reps 150] [--block 5]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import statistics
import sys
import timeit
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's ddpviz

from _ranks import free_port, join_gloo, run_ranks
from bench_watch import MODELS, WARMUP_BLOCKS, _median_interval, _model

VARIANTS = ["torch DDP", "torch DDP (A/A)", "default", "no contract"]
MICRO = 4


def _deep(n: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(16, 16) for _ in range(n)])


def _us(stmt: Any, number: int) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=7)) / number * 1e6


def pieces() -> None:
    """Part 1: the contract's pieces, in microseconds per call."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    from torch.optim.optimizer import _global_optimizer_pre_hooks

    from ddpviz.events import Tap
    from ddpviz.probes import sync_contract as sc

    model = _deep(64)
    ddp = nn.parallel.DistributedDataParallel(model)
    params = list(model.parameters())
    contract = sc.SyncContract(ddp, params, [str(i) for i in range(len(params))], Tap(None),
                               world_size=1)
    opt = torch.optim.SGD(params, lr=0.0)

    def forward_local() -> None:  # the first under no_sync() after a synced one
        contract.forward(True)
        contract.forward(False)

    rows = [("forward, synced", _us(lambda: contract.forward(True), 200_000)),
            ("forward, synced + the first under no_sync() (notes its call site)",
             _us(forward_local, 100_000)),
            ("canary hook after a synced forward", _us(contract.accumulated, 200_000)),
            ("collectives count (once per backward with dirt)",
             _us(sc.collectives_issued, 20_000))]
    contract.forward(True)
    pre = next(h for h in _global_optimizer_pre_hooks.values()
               if getattr(h, "__module__", "") == sc.__name__)
    rows.append(("optimizer-step hook, nothing to judge",
                 _us(lambda: pre(opt, (opt,), {}), 200_000)))
    contract.close()
    small = _deep(4)  # 8 tensors: a short backward, so the hooks' cost shows
    canaries = sc.SyncContract(small, list(small.parameters()), [""] * 8, Tap(None),
                               world_size=1)
    canaries.forward(True)
    x = torch.randn(8, 16)

    def backward() -> None:
        small(x).sum().backward()

    with_hooks, without = [], []
    for _ in range(30):  # interleaved: with the canaries, then without
        with_hooks.append(_us(backward, 200))
        canaries.drop_canaries()
        without.append(_us(backward, 200))
        canaries.add_canaries()
    rows.append((f"{sc.CANARIES} canaries in a backward of 8 tensors (min - min of 30)",
                 min(with_hooks) - min(without)))
    rows.append(("  (that backward, without canaries: min of 30)", min(without)))
    canaries.close()
    dist.destroy_process_group()
    print(f"{'piece':66}{'us':>8}")
    for name, us in rows:
        print(f"{name:66}{us:>8.2f}")


def _rank(rank: int, world: int, port: int, args: Any, out: Any) -> None:
    import time

    import ddpviz

    join_gloo(rank, world, port)
    rows = []
    models = {**MODELS, "128 tensors": (16, 16, 16)}
    for model_name, dims in models.items():
        for accumulate in (False, True):
            variants: dict[str, Any] = {}
            watches = []
            for name in VARIANTS:
                net = _deep(64) if model_name == "128 tensors" else _model(dims)
                ddp = nn.parallel.DistributedDataParallel(net)
                if not name.startswith("torch DDP"):
                    w = ddpviz.watch(ddp)
                    if name == "no contract":
                        w._contract.close()
                    watches.append(w)
                variants[name] = ddp
            opts = {n: torch.optim.SGD(m.parameters(), lr=0.01) for n, m in variants.items()}
            g = torch.Generator().manual_seed(rank)
            x = torch.randn(16, dims[0], generator=g)
            y = torch.randn(16, dims[-1], generator=g)
            wall: dict[str, list[float]] = {n: [] for n in VARIANTS}
            cpu: dict[str, list[float]] = {n: [] for n in VARIANTS}
            thread: dict[str, list[float]] = {n: [] for n in VARIANTS}
            for rep in range(WARMUP_BLOCKS + args.reps):
                for name in VARIANTS[rep % 4:] + VARIANTS[:rep % 4]:
                    model, opt = variants[name], opts[name]
                    dist.barrier()
                    t0, c0, h0 = time.perf_counter(), time.process_time(), time.thread_time()
                    for _ in range(args.block):
                        for i in range(MICRO if accumulate else 1):
                            last = not accumulate or i == MICRO - 1
                            with contextlib.nullcontext() if last else model.no_sync():
                                nn.functional.mse_loss(model(x), y).backward()
                        opt.step()
                        opt.zero_grad()
                    if rep >= WARMUP_BLOCKS:
                        wall[name].append(time.perf_counter() - t0)
                        cpu[name].append(time.process_time() - c0)
                        thread[name].append(time.thread_time() - h0)
            for w in watches:
                w.close()
            rows.append((model_name, accumulate, wall, cpu, thread))
    out.put((rank, rows))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=150)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--skip-pieces", action="store_true")
    args = parser.parse_args()
    if not args.skip_pieces:
        pieces()
        print()
    print(f"{'model':12} {'loop':12} {'variant':16}{'step us':>9}{'thread':>8}"
          f"{'95% interval':>15}{'cpu':>8}{'95% interval':>15}")
    for model_name, accumulate, wall, cpu, thread in run_ranks(_rank, 2, args)[0]:
        loop = f"{MICRO} micro" if accumulate else "1 backward"
        for name in VARIANTS:
            step_us = statistics.median(wall[name]) / args.block * 1e6
            cells = []
            for kind in (thread, cpu):
                ratios = np.array(kind[name]) / np.array(kind["torch DDP"])
                lo, hi = _median_interval(ratios)
                cells.append(f"{np.median(ratios):>8.3f}{lo:>9.3f}-{hi:.3f}")
            print(f"{model_name:12} {loop:12} {name:16}{step_us:>9.0f}{''.join(cells)}")


if __name__ == "__main__":
    main()
