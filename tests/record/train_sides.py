"""An unmodified torch DDP script (no ddpviz import) whose gradient-sync contract breaks on the
ranks' different sides; what tests/record/test_sides.py runs under `ddpviz record` and without
it. Each phase builds its own model, DDP and optimizer, trains a few steps and prints a digest
of its final parameters ("rank R phase NAME bits HEX").

Phases: one_rank (only rank 1 trains, the model the DDP wraps, directly: rank 0 holds no such
evidence), two_sites (every rank trains the wrapped model directly, each from a line of its
own) and the healthy twins (every rank trains through the DDP, each from a line of its own).
Lines marked `# LINE:phase:what` are read by the test.
"""


import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tests.record.train_contract import run_phases

STEPS = 3


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * step + rank))


def one_rank(rank: int) -> list[nn.Module]:
    net = model()
    ddp = DistributedDataParallel(net)  # LINE:one_rank:built
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    if rank == 1:
        for step in range(STEPS):
            net(batch(rank, step)).square().sum().backward()  # LINE:one_rank:backward
            opt.step()  # LINE:one_rank:step
            opt.zero_grad()
    return [net]


def two_sites(rank: int) -> list[nn.Module]:
    net = model()
    ddp = DistributedDataParallel(net)  # LINE:two_sites:built
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        if rank == 0:
            net(batch(rank, step)).square().sum().backward()  # LINE:two_sites:backward0
        else:
            net(batch(rank, step)).square().sum().backward()  # LINE:two_sites:backward1
        opt.step()  # LINE:two_sites:step
        opt.zero_grad()
    return [net]


def healthy(rank: int) -> list[nn.Module]:
    ddp = DistributedDataParallel(model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        if rank == 0:
            ddp(batch(rank, step)).square().sum().backward()
        else:
            ddp(batch(rank, step)).square().sum().backward()
        opt.step()
        opt.zero_grad()
    return [ddp]


PHASES = {"one_rank": one_rank, "two_sites": two_sites, "healthy": healthy}


def main() -> None:
    run_phases(PHASES)


if __name__ == "__main__":
    main()
