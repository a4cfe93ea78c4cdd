"""An unmodified torch DDP script (no ddpviz import) that issues collectives of its own around
DDP, as real jobs do (metrics, checkpoints, debug prints, a subgroup), with one planted defect
chosen by TRAIN_DEFECT (tests/record/test_collectives.py):

- gather: rank 1's metrics tensor has 4 elements, rank 0's 3, in an all_gather (log_metrics);
- reduce_size: an all_reduce of 3 elements on rank 0 and 4 on rank 1 (reduce_stats);
- barrier: only rank 0 enters a barrier (save_checkpoint);
- extra: only rank 1 all_reduces its loss (debug_print);
- groups: rank 0 all_reduces on the default group, rank 1 on a subgroup (sync_group);
- src: each rank broadcasts from itself (share_seed);
- gather_late: log_metrics' all_gather (a call site that ran every step before) has 4
  elements on rank 1 at step TRAIN_AT only, 3 otherwise (TRAIN_AT=-1: never, a healthy
  twin); each rank prints torch's sequence number of the default group before that call;
- funcol_size: a functional all_reduce (torch.distributed._functional_collectives) of 3
  elements on rank 0 and 4 on rank 1 (funcol_stats);
- none: healthy, with many collectives of its own every step (metrics, object collectives, a
  periodic barrier, a subgroup, point-to-point), which must report nothing.
Each call line carries a marker comment (`# <name>`) the test finds the line number by.
TRAIN_STEPS (default 12), TRAIN_AT (default 5): the step the defect happens at ("gather"
happens from step 0, like a metric whose size differs from the start).
"""

import datetime
import hashlib
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import nn
from torch.nn.parallel import DistributedDataParallel

DEFECT = os.environ.get("TRAIN_DEFECT", "none")
AT = int(os.environ.get("TRAIN_AT", "5"))


def log_metrics(rank: int, loss: float, step: int) -> None:
    n = 4 if rank == 1 and (DEFECT == "gather" or (DEFECT == "gather_late" and step == AT)) else 3
    t = torch.full((n,), loss)
    out = [torch.zeros(n) for _ in range(dist.get_world_size())]
    if DEFECT == "gather_late" and step == AT:  # torch's own count of the group's collectives
        seq = dist.group.WORLD._get_sequence_number_for_group()
        print(f"train_collectives: rank {rank} seq {seq} before log_metrics at step {step}",
              flush=True)
    dist.all_gather(out, t)  # <log_metrics>


def reduce_stats(rank: int) -> None:
    dist.all_reduce(torch.ones(3 + rank))  # <reduce_stats>


def save_checkpoint() -> None:
    dist.barrier()  # <save_checkpoint>


def debug_print(loss: torch.Tensor) -> None:
    t = loss.detach().reshape(1).clone()
    dist.all_reduce(t)  # <debug_print>


def sync_group(rank: int, sub: dist.ProcessGroup) -> None:
    dist.all_reduce(torch.ones(2), group=sub if rank == 1 else None)  # <sync_group>


def share_seed(rank: int) -> None:
    dist.broadcast(torch.zeros(2), src=rank)  # <share_seed>


def funcol_stats(rank: int) -> None:
    out = funcol.all_reduce(torch.ones(3 + rank), "sum", dist.group.WORLD)  # <funcol_stats>
    float(out.sum())


def functional_extras(step: int, rank: int, world: int) -> float:
    """Functional collectives as healthy jobs (and DTensor) issue them, their sizes changing
    from step to step alike on every rank; what they return, summed (the same with ddpviz)."""
    n = world * (1 + step % 3)
    x = torch.arange(n, dtype=torch.float32) * (rank + 1) + step
    group = dist.group.WORLD
    outs = [funcol.all_reduce(x, "sum", group),
            funcol.all_gather_single(x[:1 + step % 2], 0, group),
            funcol.reduce_scatter_single(x, "sum", 0, group),
            funcol.all_to_all_single(x, None, None, group),
            funcol.broadcast(x, 1, group),
            *funcol.all_reduce_coalesced([x, x * 2], "max", group)]
    return sum(float(o.double().sum()) for o in outs)


def healthy_extras(step: int, rank: int, world: int, sub: dist.ProcessGroup,
                   loss: torch.Tensor) -> None:
    """What healthy jobs do around DDP: all of it pairs on every rank."""
    total = loss.detach().reshape(1).clone()
    dist.all_reduce(total)
    if step % 3 == 0:
        got: list[object] = [None] * world
        dist.all_gather_object(got, {"rank": rank, "loss": float(loss)})
        box: list[object] = [{"lr": 0.1, "step": step} if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
    if step % 4 == 0:
        dist.barrier()
    dist.all_reduce(torch.ones(5), group=sub)
    work = dist.all_reduce(torch.ones(2), async_op=True)
    work.wait()
    if step % 5 == 0 and rank < 2:  # point-to-point: only ranks 0 and 1 take part
        buf = torch.zeros(3)
        if rank == 0:
            dist.send(torch.ones(3), dst=1)
        else:
            dist.recv(buf, src=0)
    if step == 2:
        gathered = torch.zeros(world * 4)
        dist.all_gather_into_tensor(gathered, torch.ones(4) * rank)


def main() -> None:
    timeout = datetime.timedelta(seconds=float(os.environ.get("TRAIN_PG_TIMEOUT", "60")))
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    sub = dist.new_group(list(range(world)))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    ddp = DistributedDataParallel(model)  # (its constructor's collectives: every rank is in)
    if rank == 0:
        print("train_collectives: every rank joined", flush=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1 + rank)
    extras = 0.0
    for step in range(int(os.environ.get("TRAIN_STEPS", "12"))):
        x = torch.randn(4, 8, generator=data)
        loss = ddp(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        log_metrics(rank, float(loss), step)
        if DEFECT == "none":
            healthy_extras(step, rank, world, sub, loss)
            extras += functional_extras(step, rank, world)
        elif step == AT:
            if DEFECT == "reduce_size":
                reduce_stats(rank)
            elif DEFECT == "barrier" and rank == 0:
                save_checkpoint()
            elif DEFECT == "extra" and rank == 1:
                debug_print(loss)
            elif DEFECT == "groups":
                sync_group(rank, sub)
            elif DEFECT == "src":
                share_seed(rank)
            elif DEFECT == "funcol_size":
                funcol_stats(rank)
        time.sleep(0.02)
    checksum = sum(float(p.double().sum()) for p in model.parameters())
    print(f"rank {rank} done {checksum:.6f} {extras!r}", flush=True)
    if os.environ.get("TRAIN_DONE_DIR"):  # (torchrun's shared stdout can lose a rank's line)
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                         for p in model.parameters())).hexdigest()
        Path(os.environ["TRAIN_DONE_DIR"], f"rank{rank}").write_text(
            f"rank {rank} done {checksum:.6f} {extras!r}\nparameters sha256 {digest}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
