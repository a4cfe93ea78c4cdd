"""What diagnosis costs per training step, on 2 gloo ranks (CPU).

Four DDP copies of one MLP train inside the same two processes, one step each in turn (the
order rotates each repetition, so machine noise hits them alike): ddpviz's engine with the hang
watchdog off (hang_timeout=0) and on (the default), torch's DDP alone and with ddpviz.watch
attached. Medians over the repetitions and the median of per-repetition ratios. Then the store
operations a heartbeat uses, timed alone.

    python benchmarks/bench_diagnosis.py [--steps 150]
"""

from __future__ import annotations

import argparse
import datetime
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

WARMUP = 8
ROWS = ("ddpviz, watchdog off", "ddpviz, watchdog on", "torch DDP", "torch DDP + watch")


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(),
                         nn.Linear(512, 10))


def _rank(rank: int, world: int, port: int, steps: int, out: Any) -> None:
    import ddpviz

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    models = {
        ROWS[0]: ddpviz.DistributedDataParallel(_mlp(), hang_timeout=0),
        ROWS[1]: ddpviz.DistributedDataParallel(_mlp()),
        ROWS[2]: nn.parallel.DistributedDataParallel(_mlp()),
        ROWS[3]: nn.parallel.DistributedDataParallel(_mlp()),
    }
    ddpviz.watch(models[ROWS[3]])
    opts = {k: torch.optim.SGD(m.parameters(), lr=0.01) for k, m in models.items()}
    x, y = torch.randn(32, 256), torch.randint(0, 10, (32,))
    times: dict[str, list[float]] = {k: [] for k in ROWS}
    for rep in range(WARMUP + steps):
        order = ROWS[rep % 4:] + ROWS[:rep % 4]
        for name in order:
            start = time.perf_counter()
            loss = nn.functional.cross_entropy(models[name](x), y)
            loss.backward()
            opts[name].step()
            opts[name].zero_grad()
            if rep >= WARMUP:
                times[name].append(time.perf_counter() - start)
    out.put((rank, times))
    dist.destroy_process_group()


def _store_ops() -> dict[str, float]:
    server = dist.TCPStore("127.0.0.1", 0, 2, True, datetime.timedelta(seconds=10),
                           wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", server.port, 2, False, datetime.timedelta(seconds=10))
    result = {}
    ops = {"store.set (heartbeat position)": lambda: client.set("pos", '{"step": 3}'),
           "store.add (alert check, <= 2/s)": lambda: client.add("alerts", 0)}
    for name, op in ops.items():
        samples = []
        for _ in range(2000):
            start = time.perf_counter()
            op()
            samples.append(time.perf_counter() - start)
        result[name] = statistics.median(samples) * 1e6
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    results = run_ranks(_rank, 2, args.steps, timeout=600)
    times = results[0]
    print(f"diagnosis cost per step: MLP 0.8M params, 2 gloo ranks on CPU, batch 32, "
          f"{args.steps} rotated repetitions, rank 0")
    print(f"{'step':36}{'median ms':>10}{'ratio':>9}   per-repetition ratio quartiles")
    for name, base in ((ROWS[0], ROWS[0]), (ROWS[1], ROWS[0]), (ROWS[2], ROWS[2]),
                       (ROWS[3], ROWS[2])):
        ratios = [a / b for a, b in zip(times[name], times[base], strict=True)]
        q = statistics.quantiles(ratios, n=4)
        print(f"{name:36}{statistics.median(times[name]) * 1e3:>10.2f}"
              f"{statistics.median(ratios):>9.3f}   {q[0]:.3f}-{q[2]:.3f}")
    print(f"\n{'store operation, alone':36}{'median us':>10}")
    for name, us in _store_ops().items():
        print(f"{name:36}{us:>10.1f}")


if __name__ == "__main__":
    main()
