"""An unmodified torch DDP script (no ddpviz import) that breaks DDP's gradient-sync contract in
some phases and keeps it in others; what tests/record/test_contract.py runs under `ddpviz
record` and without it. Each phase builds its own model, DDP and optimizer, trains a few steps
and prints a digest of its final parameters ("rank R phase NAME bits HEX").

Phases (TRAIN_PHASES, comma-separated; default all): module (the loss computed on ddp.module
after an evaluation forward through the DDP), no_sync_last (no_sync() around the last
micro-batch), unused (a DDP built and never called while its model trains), and the healthy
accumulate (no_sync() on the first micro-batches), forced_sync (no_sync() on every
micro-batch, then a manual all-reduce) and teacher (a DDP used under no_grad only, beside a
trained one). Lines marked `# LINE:phase:what` are read by the test.
"""

import atexit
import contextlib
import hashlib
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

STEPS = 3
MICRO = 3


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))


def batch(rank: int, step: int, i: int = 0) -> torch.Tensor:
    return torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * step + 10 * i + rank))


def module(rank: int) -> list[nn.Module]:
    ddp = DistributedDataParallel(model())  # LINE:module:built
    with torch.no_grad():
        ddp(batch(rank, -1))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        loss = ddp.module(batch(rank, step)).square().sum()
        loss.backward()  # LINE:module:backward
        opt.step()  # LINE:module:step
        opt.zero_grad()
    return [ddp]


def no_sync_last(rank: int) -> list[nn.Module]:
    ddp = DistributedDataParallel(model())  # LINE:no_sync_last:built
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        for i in range(MICRO):
            with ddp.no_sync() if i == MICRO - 1 else contextlib.nullcontext():
                out = ddp(batch(rank, step, i))  # LINE:no_sync_last:forward
                out.square().sum().backward()  # LINE:no_sync_last:backward
        opt.step()  # LINE:no_sync_last:step
        opt.zero_grad()
    return [ddp]


def unused(rank: int) -> list[nn.Module]:
    net = model()
    ddp = DistributedDataParallel(net)  # LINE:unused:built
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        net(batch(rank, step)).square().sum().backward()  # LINE:unused:backward
        opt.step()  # LINE:unused:step
        opt.zero_grad()
    return [net]


def accumulate(rank: int) -> list[nn.Module]:
    ddp = DistributedDataParallel(model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        for i in range(MICRO):
            with ddp.no_sync() if i < MICRO - 1 else contextlib.nullcontext():
                ddp(batch(rank, step, i)).square().sum().backward()
        opt.step()
        opt.zero_grad()
    return [ddp]


def forced_sync(rank: int) -> list[nn.Module]:
    ddp = DistributedDataParallel(model())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for step in range(STEPS):
        for i in range(MICRO):
            with ddp.no_sync():
                ddp(batch(rank, step, i)).square().sum().backward()
        for p in ddp.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad.div_(dist.get_world_size())
        opt.step()
        opt.zero_grad()
    return [ddp]


def teacher(rank: int) -> list[nn.Module]:
    frozen, student = DistributedDataParallel(model()), DistributedDataParallel(model())
    opt = torch.optim.SGD(student.parameters(), lr=0.1)
    for step in range(STEPS):
        x = batch(rank, step)
        with torch.no_grad():
            target = frozen(x)
        (student(x) - target).square().sum().backward()
        opt.step()
        opt.zero_grad()
    return [frozen, student]


PHASES = {"module": module, "no_sync_last": no_sync_last, "unused": unused,
          "accumulate": accumulate, "forced_sync": forced_sync, "teacher": teacher}


def main() -> None:
    run_phases(PHASES)


def run_phases(phases: dict) -> None:
    """Run the phases $TRAIN_PHASES names (all by default), print each one's parameter bits,
    and exit as train_plain.py does (also for train_sides.py)."""
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    names = [p for p in os.environ.get("TRAIN_PHASES", ",".join(phases)).split(",") if p]
    for name in names:
        trained = phases[name](rank)
        raw = b"".join(p.detach().numpy().tobytes() for m in trained for p in m.parameters())
        print(f"rank {rank} phase {name} bits {hashlib.sha256(raw).hexdigest()[:20]}",
              flush=True)
    # as train_plain.py: exit handlers, then os._exit (gloo's teardown at exit can abort)
    dist.barrier()
    sys.stdout.flush()
    atexit._run_exitfuncs()
    os._exit(0)


if __name__ == "__main__":
    main()
