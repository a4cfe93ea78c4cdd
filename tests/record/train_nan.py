"""An unmodified torch DDP script (no ddpviz import) for the NaN-origin tests
(tests/record/test_nonfinite.py): a two-layer model (fc1, fc2), 40 steps by default.

Environment knobs: TRAIN_STEPS; TRAIN_NAN=grad (rank 1's fc1.weight gradient made NaN by a
gradient hook at step TRAIN_NAN_STEP) or input (rank 1's batch gets a NaN at that step);
TRAIN_MODE=bf16|bucket_view|static_graph|find_unused (healthy variants: the model in bf16, DDP's
gradient_as_bucket_view / static_graph / find_unused_parameters). Prints each rank's parameter
bits at the end (bitwise comparison with an unwatched run). Several modes, comma-separated
(TRAIN_MODE=,bf16,bucket_view: fp32 first), train one after another in the same processes, each
from the same seeds as alone, and each prints its bits as "rank R mode=MODE bits ...": the
unwatched runs of several configurations in one launch.
"""

import atexit
import hashlib
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def train(rank: int, mode: str, plant: str, at: int) -> str:
    """Train one model in `mode`; the hash of its parameters' bits."""
    dtype = torch.bfloat16 if mode == "bf16" else torch.float32
    torch.manual_seed(0)
    model = Net().to(dtype)
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=mode == "bucket_view",
                                  static_graph=mode == "static_graph",
                                  find_unused_parameters=mode == "find_unused")
    step = 0
    if plant == "grad" and rank == 1:
        model.fc1.weight.register_hook(lambda g: g * float("nan") if step == at else g)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(int(os.environ.get("TRAIN_STEPS", "40"))):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(4, 8, generator=g).to(dtype)
        if plant == "input" and rank == 1 and step == at:
            x[0, 0] = float("nan")
        opt.zero_grad()
        out = ddp(x)
        out.float().square().mean().backward()
        opt.step()
    raw = hashlib.sha256(b"".join(p.detach().float().numpy().tobytes()
                                  for p in model.parameters()))
    return raw.hexdigest()[:20]


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    modes = os.environ.get("TRAIN_MODE", "").split(",")
    plant = os.environ.get("TRAIN_NAN", "")
    at = int(os.environ.get("TRAIN_NAN_STEP", "-1"))
    for mode in modes:
        bits = train(rank, mode, plant, at)
        label = f" mode={mode}" if len(modes) > 1 else ""
        print(f"rank {rank}{label} bits {bits}", flush=True)
    dist.barrier()  # (leave as train_plain.py does: atexit handlers, then os._exit)
    sys.stdout.flush()
    atexit._run_exitfuncs()
    os._exit(0)


if __name__ == "__main__":
    main()
