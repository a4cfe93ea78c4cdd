"""A plain torch DDP job in the forms frameworks and users build it, launched by torchrun
(no ddpviz import). FW_MODE picks the form:

  plain         DDP(model)
  py_hook       DDP(model) + register_comm_hook(fp16_compress_hook), a Python hook
  builtin_hook  DDP(model) + _register_builtin_comm_hook(FP16_COMPRESS), torch's C++ hook
  replicate     torch.distributed._composable.replicate(model)
  compile_outer torch.compile(DDP(model))
  compile_inner DDP(torch.compile(model))

FW_OPTIMIZE_DDP sets torch._dynamo.config.optimize_ddp for the compile modes
("ddp_optimizer", "python_reducer", "no_optimization"). The compile backend is "aot_eager":
dynamo and AOT autograd as with inductor (where DDP's graph breaks and hooks live), without
inductor's C++ compilation, which takes minutes on two CPU cores.
"""

from __future__ import annotations

import atexit
import datetime
import os
import sys

import torch
import torch._dynamo
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.frameworks.jobs import report


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32))
        self.head = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.encoder(x)))


def main() -> None:
    mode = os.environ.get("FW_MODE", "plain")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Net()
    # A small bucket cap (more than one bucket, so the bucket map says something), except under
    # torch.compile: dynamo's DDPOptimizer asserts that DDP's first bucket (1 MB) is no larger
    # than the others.
    cap = {} if mode.startswith("compile") else {"bucket_cap_mb": 0.004}
    ddp_module: nn.Module | None
    if mode.startswith("compile"):  # as a user would, before the DDP is built (python_reducer
        # takes effect in DDP's constructor)
        torch._dynamo.config.optimize_ddp = os.environ.get("FW_OPTIMIZE_DDP", "ddp_optimizer")
    if mode == "replicate":
        from torch.distributed._composable import replicate

        train = replicate(model, **cap)
        ddp_module = None
    elif mode == "compile_inner":
        ddp = DDP(torch.compile(model, backend="aot_eager"), **cap)
        train, ddp_module = ddp, ddp.module
    else:
        ddp = DDP(model, **cap)
        ddp_module = ddp.module
        if mode == "py_hook":
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

            ddp.register_comm_hook(dist.group.WORLD, default_hooks.fp16_compress_hook)
        elif mode == "builtin_hook":
            ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
        train = ddp
        if mode == "compile_outer":
            train = torch.compile(ddp, backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(report.steps()):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(4, 8, generator=g)
        opt.zero_grad()
        train(x).square().sum().backward()
        opt.step()
    report.write(rank, model=model, ddp_module=ddp_module)
    dist.barrier()
    # as tests/record/train_plain.py: exit handlers, then os._exit (gloo's teardown at
    # interpreter exit can abort a rank under load)
    sys.stdout.flush()
    atexit._run_exitfuncs()
    os._exit(0)


if __name__ == "__main__":
    main()
