"""An accelerate job (a small MLP, synthetic data), launched by `accelerate launch` on CPU (no
ddpviz import). accelerate's `prepare` builds torch's DDP.

FW_MISMATCH=1 plants a defect: rank 1 builds `encoder.2` with a different output size.
"""

from __future__ import annotations

import os

import torch
from accelerate import Accelerator
from torch import nn

from tests.frameworks.jobs import report


def net(hidden: int) -> nn.Module:
    model = nn.Module()
    model.encoder = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, hidden))
    model.head = nn.Linear(hidden, 2)
    model.forward = lambda x: model.head(torch.relu(model.encoder(x)))  # type: ignore[method-assign]
    return model


def main() -> None:
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    rank = accelerator.process_index
    torch.manual_seed(0)
    planted = os.environ.get("FW_MISMATCH") == "1" and rank == 1
    model = net(33 if planted else 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=g),
                                          torch.randn(64, 2, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    ddp, opt, loader = accelerator.prepare(model, opt, loader)
    assert isinstance(ddp, nn.parallel.DistributedDataParallel), type(ddp)
    for step, (x, y) in enumerate(loader):
        if step == report.steps():
            break
        opt.zero_grad()
        accelerator.backward((ddp(x) - y).square().mean())
        opt.step()
    report.write(rank, model=model, ddp_module=ddp.module)
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
