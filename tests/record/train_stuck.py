"""An unmodified torch DDP script with one rank in trouble at one step (no ddpviz import).

TRAIN_PLANT picks the trouble of rank TRAIN_RANK (default 1) at step TRAIN_AT (default 3):
  sleep    its data loading sleeps TRAIN_SLEEP_S seconds (a stuck loader);
  barrier  it enters a barrier of its own on a side group no other rank joins (stuck in C++);
  break    it leaves the loop (uneven data) and waits in the script's final barrier;
  quit     it leaves the loop and its script returns (the process exits normally);
  gil      its data loading calls C code that holds the GIL for TRAIN_SLEEP_S seconds (libc's
           sleep() through ctypes.PyDLL): no Python thread of the rank can run meanwhile.
TRAIN_STEPS (default 6), TRAIN_PG_TIMEOUT (default 20 s), TRAIN_JOIN=1 runs the loop inside
`with ddp.join():`, TRAIN_STEP_S sleeps that long in every rank's data loading. The lines
marked PLANTED are what the tests expect ddpviz to name.
"""

import atexit
import contextlib
import ctypes
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

PLANT = os.environ.get("TRAIN_PLANT", "")
AT = int(os.environ.get("TRAIN_AT", "3"))
WHO = int(os.environ.get("TRAIN_RANK", "1"))


def load_batch(step: int, rank: int) -> torch.Tensor:
    if PLANT == "sleep" and rank == WHO and step == AT:
        time.sleep(float(os.environ.get("TRAIN_SLEEP_S", "60")))  # PLANTED sleep
    if PLANT == "gil" and rank == WHO and step == AT:
        libc = ctypes.PyDLL(None)  # a PyDLL call keeps the GIL
        libc.sleep(int(os.environ.get("TRAIN_SLEEP_S", "60")))  # PLANTED gil
    time.sleep(float(os.environ.get("TRAIN_STEP_S", "0")))  # a slow loader, on every rank
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(4, 8, generator=g)


def sync_side(side: dist.ProcessGroup) -> None:
    dist.barrier(group=side)  # PLANTED barrier


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("TRAIN_PG_TIMEOUT", "20")))
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    torch.set_num_threads(1)
    side = dist.new_group(backend="gloo", timeout=timeout)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    joined = ddp.join() if os.environ.get("TRAIN_JOIN") == "1" else contextlib.nullcontext()
    with joined:  # TRAIN_JOIN=1: torch's uneven-input support, nothing hangs
        steps = loop(ddp, opt, side, rank)
    print(f"rank {rank} ran {steps} steps", flush=True)
    if PLANT == "quit" and rank == WHO:
        return  # PLANTED quit: the interpreter exits normally
    dist.barrier()  # PLANTED end
    sys.stdout.flush()
    atexit._run_exitfuncs()  # (ddpviz's trace flush among them), as launch()'s ranks
    os._exit(0)


def loop(ddp: DistributedDataParallel, opt: torch.optim.Optimizer, side: dist.ProcessGroup,
         rank: int) -> int:
    steps = 0
    for step in range(int(os.environ.get("TRAIN_STEPS", "6"))):
        if PLANT in ("break", "quit") and rank == WHO and step == AT:
            break  # PLANTED break
        if PLANT == "barrier" and rank == WHO and step == AT:
            sync_side(side)
        x = load_batch(step, rank)
        opt.zero_grad()
        ddp(x).square().sum().backward()
        opt.step()
        steps += 1
    return steps


if __name__ == "__main__":
    main()
