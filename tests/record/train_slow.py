"""An unmodified torch DDP script (no ddpviz import) with one rank slower than the others:
what `ddpviz record` runs in tests/record/test_straggler.py.

Every rank "loads" each batch in TRAIN_LOAD_S seconds (a sleep: the same on every rank, and
not at the mercy of a busy machine's scheduler), then runs a 4-layer MLP whose parameters
fall into 4 buckets (bucket_cap_mb small). TRAIN_SLOW_RANK=R slows rank R by TRAIN_SLOW_S
seconds a step in TRAIN_SLOW_PHASE: "backward" (a sleep in the second layer's backward hook),
"data" (a longer load) or "optimizer" (a sleep in an optimizer step pre-hook of the script's
own). TRAIN_STEPS steps (default 60).
"""

import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8))
    ddp = DistributedDataParallel(model, bucket_cap_mb=0.2)
    slow = os.environ.get("TRAIN_SLOW_RANK") == str(rank)
    phase = os.environ.get("TRAIN_SLOW_PHASE", "backward")
    extra = float(os.environ.get("TRAIN_SLOW_S", "0.012"))
    load = float(os.environ.get("TRAIN_LOAD_S", "0.03"))
    if slow and phase == "backward":
        model[2].register_full_backward_hook(lambda m, gi, go: time.sleep(extra))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    if slow and phase == "optimizer":
        opt.register_step_pre_hook(lambda o, args, kwargs: time.sleep(extra))
    for step in range(int(os.environ.get("TRAIN_STEPS", "60"))):
        time.sleep(load + (extra if slow and phase == "data" else 0.0))
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(32, 64, generator=g)
        loss = ddp(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
