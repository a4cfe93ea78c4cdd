"""The job bench_attach.py runs under `ddpviz record --out` (no ddpviz import): an MLP on 2
gloo ranks; after WARMUP steps each rank writes JOB_GATE.reached{RANK} and waits for JOB_GATE
(the benchmark attaches, or not, then creates it); then JOB_STEPS timed steps. Rank 0 prints
`ATTACH_BENCH {"wall_ms": ..., "cpu_ms": ...}`: medians of its steps' wall time and
training-thread CPU time."""

import atexit
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

WARMUP = 10


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(256, 256), nn.ReLU())])
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.25)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(32, 256)
    walls, cpus = [], []
    gate = os.environ["JOB_GATE"]
    for step in range(WARMUP + int(os.environ.get("JOB_STEPS", "400"))):
        if step == WARMUP:
            with open(f"{gate}.reached{rank}", "w") as f:
                f.write("1")
            while not os.path.exists(gate):
                time.sleep(0.01)
            dist.barrier()
        t, c = time.perf_counter(), time.thread_time()
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()
        if step >= WARMUP:
            walls.append(time.perf_counter() - t)
            cpus.append(time.thread_time() - c)
    if rank == 0:
        print("ATTACH_BENCH " + json.dumps({"wall_ms": statistics.median(walls) * 1e3,
                                            "cpu_ms": statistics.median(cpus) * 1e3}),
              flush=True)
    dist.barrier()
    sys.stdout.flush()
    atexit._run_exitfuncs()
    os._exit(0)


if __name__ == "__main__":
    main()
