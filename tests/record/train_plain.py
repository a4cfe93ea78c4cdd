"""An unmodified torch DDP training script (no ddpviz import): what `ddpviz record` runs.

Environment knobs (tests only): TRAIN_STEPS, TRAIN_HOOK=1 registers a comm hook after
construction (it counts its calls into TRAIN_HOOK_LOG), TRAIN_ABSENT=R makes rank R sleep
instead of constructing DDP, TRAIN_PG_TIMEOUT the process group's timeout in seconds,
TRAIN_DEVICE=cuda uses NCCL and one GPU per rank. TRAIN_MISMATCH=shape|name builds a different
model on rank 1 (a layer 17 wide instead of 16 / the same layout under other names).
TRAIN_DIVERGE=S: rank 1 edits its last layer's bias in place after step S (replicas drift).
TRAIN_LR2=R: rank R trains with twice the learning rate (replicas drift from step 0).
TRAIN_DESTROY=1: the job ends with dist.destroy_process_group().
TRAIN_UNUSED=1: DDP wraps the model beside a layer that its forward never uses.
TRAIN_RAISE=R: rank R dies of an uncaught ValueError after its last step (the others end
normally).
TRAIN_LAZY=1: DDP(lazy_bucket_allocation=True, gradient_as_bucket_view=True) (torch 2.15).
(The forms frameworks build, torch.compile and replicate() included: tests/frameworks.)
"""

import atexit
import datetime
import hashlib
import os
import sys
import time
from collections import OrderedDict

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


class _WithUnused(nn.Module):
    """The model beside a layer its forward never uses (TRAIN_UNUSED=1)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model, self.unused = model, nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)


def main() -> None:
    cuda = os.environ.get("TRAIN_DEVICE") == "cuda"
    timeout = datetime.timedelta(seconds=float(os.environ.get("TRAIN_PG_TIMEOUT", "60")))
    if "RANK" not in os.environ:  # plain `python train.py`: a world of one
        os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=os.environ.get("TRAIN_PORT", "29533"))
    dist.init_process_group("nccl" if cuda else "gloo", timeout=timeout)
    rank = dist.get_rank()
    torch.set_num_threads(1)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else None
    if cuda:
        torch.cuda.set_device(device)
    if os.environ.get("TRAIN_ABSENT") == str(rank):
        time.sleep(float(os.environ.get("TRAIN_ABSENT_S", "30")))
        return
    torch.manual_seed(0)
    mismatch = os.environ.get("TRAIN_MISMATCH") if rank == 1 else None
    width = 17 if mismatch == "shape" else 16
    if mismatch == "name":
        model = nn.Sequential(OrderedDict(inp=nn.Linear(8, width), act=nn.ReLU(),
                                          out=nn.Linear(width, 2))).to(device)
    else:
        model = nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 2)).to(device)
    net = _WithUnused(model).to(device) if os.environ.get("TRAIN_UNUSED") == "1" else model
    lazy = ({"lazy_bucket_allocation": True, "gradient_as_bucket_view": True}
            if os.environ.get("TRAIN_LAZY") == "1" else {})
    ddp = DistributedDataParallel(net, device_ids=[device] if cuda else None, **lazy)
    calls = []
    if os.environ.get("TRAIN_HOOK") == "1":
        def hook(state, bucket):
            calls.append(bucket.index())
            fut = dist.all_reduce(bucket.buffer().div_(state.size()), group=state,
                                  async_op=True).get_future()
            return fut.then(lambda f: f.value()[0])

        ddp.register_comm_hook(dist.group.WORLD, hook)
    opt = torch.optim.SGD(ddp.parameters(),
                          lr=0.2 if os.environ.get("TRAIN_LR2") == str(rank) else 0.1)
    for step in range(int(os.environ.get("TRAIN_STEPS", "3"))):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(4, 8, generator=g).to(device)
        opt.zero_grad()
        ddp(x).square().sum().backward()
        opt.step()
        if rank == 1 and os.environ.get("TRAIN_DIVERGE") == str(step):
            with torch.no_grad():
                model[2].bias.add_(1e-4)
    if os.environ.get("TRAIN_HOOK_LOG"):
        with open(f"{os.environ['TRAIN_HOOK_LOG']}.{rank}", "w") as f:
            f.write(" ".join(map(str, calls)))
    digest = sum(float(p.detach().double().sum()) for p in ddp.parameters())
    raw = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters()))
    print(f"rank {rank} done {digest:.6f} bits {raw.hexdigest()[:20]}", flush=True)
    # Leave like ddpviz.launch's ranks do: atexit handlers (ddpviz's trace flush among them),
    # then os._exit. Tearing gloo down at interpreter exit aborted a rank under load ("terminate
    # called without an active exception", SIGABRT) in watched and unwatched runs alike.
    dist.barrier()
    if os.environ.get("TRAIN_DESTROY") == "1":
        dist.destroy_process_group()
    sys.stdout.flush()
    if os.environ.get("TRAIN_RAISE") == str(rank):
        raise ValueError("planted: this rank dies after its last step")
    atexit._run_exitfuncs()
    os._exit(0)


if __name__ == "__main__":
    main()
