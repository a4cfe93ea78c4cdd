"""An unmodified torch DDP trainer in the style of small GPT trainers (no ddpviz import):
gradient accumulation over TRAIN_ACCUM micro-steps (default 4) by toggling
`ddp.require_backward_grad_sync` on every micro-step but the last (TRAIN_SYNC=no_sync: the
`with ddp.no_sync():` form instead), a model with buffers (BatchNorm, broadcast_buffers=True),
gradient clipping and a periodic evaluation. One planted defect chosen by TRAIN_DEFECT
(tests/record/test_accum.py), each with its healthy twin:

- crash: rank 1 raises between two micro-steps of step TRAIN_AT (next_batch);
  healthy twin: none;
- clip: only rank 0 clips its gradients (clip); healthy twin: clip_all (every rank clips);
- eval: only rank 0 evaluates, through the DDP, every TRAIN_EVAL steps (evaluate); its eval
  forward broadcasts buffers that rank 1 does not; healthy twin: eval_all;
- none: healthy.
Defects combine, comma-separated (TRAIN_DEFECT=clip_all,eval_all: both healthy twins at once).
TRAIN_STEPS (default 30 optimizer steps), TRAIN_AT (default 12).
Each marked line carries a comment (`# <name>`) the test finds the line number by.
"""

import contextlib
import datetime
import hashlib
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

DEFECTS = set(os.environ.get("TRAIN_DEFECT", "none").split(","))
AT = int(os.environ.get("TRAIN_AT", "12"))
ACCUM = int(os.environ.get("TRAIN_ACCUM", "4"))
EVAL = int(os.environ.get("TRAIN_EVAL", "10"))


def next_batch(data: torch.Generator, rank: int, step: int, micro: int) -> torch.Tensor:
    if "crash" in DEFECTS and rank == 1 and step == AT and micro == 1:
        raise RuntimeError(f"planted: corrupt batch at step {step}")  # <crash>
    return torch.randn(8, 8, generator=data)


def clip(model: nn.Module, rank: int) -> None:
    if "clip_all" in DEFECTS or ("clip" in DEFECTS and rank == 0):
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)  # <clip>


@torch.no_grad()
def evaluate(ddp: nn.Module, rank: int) -> float:
    ddp.eval()
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(7))
    loss = float(ddp(x).square().mean())  # <evaluate>
    ddp.train()
    return loss


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("TRAIN_PG_TIMEOUT", "60")))
    dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1 + rank)
    no_sync = os.environ.get("TRAIN_SYNC") == "no_sync"
    for step in range(int(os.environ.get("TRAIN_STEPS", "30"))):
        for micro in range(ACCUM):
            last = micro == ACCUM - 1
            if not no_sync:
                ddp.require_backward_grad_sync = last
            x = next_batch(data, rank, step, micro)
            with contextlib.nullcontext() if last or not no_sync else ddp.no_sync():
                loss = ddp(x).square().mean() / ACCUM
                loss.backward()
        clip(model, rank)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % EVAL == 0 and (
                "eval_all" in DEFECTS or ("eval" in DEFECTS and rank == 0)):
            evaluate(ddp, rank)
    state = model.state_dict().values()
    raw = hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in state))
    print(f"rank {rank} done bits {raw.hexdigest()[:20]}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
