"""An ordinary torch DDP training script: no ddpviz anywhere. Notebook 05 runs it with
`ddpviz record -- torchrun --nproc_per_node 2 _plain_ddp_job.py`."""

import atexit
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(4):
        g = torch.Generator().manual_seed(100 * step + rank)
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 2, generator=g)
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    print(f"rank {rank}: trained 4 steps")
    dist.barrier()  # no rank tears the group down while its peer still uses it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # gloo torn down at interpreter exit aborted a rank now and then on a loaded machine
    # ("terminate called without an active exception", SIGABRT) after its work was done: leave
    # through the atexit handlers (ddpviz record's trace flush among them), then os._exit.
    sys.stdout.flush()
    atexit._run_exitfuncs()
    os._exit(0)
